package plugin

import (
	"fmt"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Every command's help points at kubectl migrate options instead of listing
// the global flags, as kubectl does: the kubeconfig flags alone are two
// dozen lines. The root's own flags are those global flags.
const (
	localFlags = `{{if .HasAvailableLocalFlags}}

Flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}`
	inheritedFlags = `{{if .HasAvailableInheritedFlags}}

Global Flags:
{{.InheritedFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}`
	ownFlagsOnly = `{{if and .HasParent .HasAvailableLocalFlags}}

Flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}`
	globalFlagsNote = `{{if or .HasAvailableInheritedFlags (not .HasParent)}}

Use "kubectl migrate options" for the flags every command takes (-n, --context, --kubeconfig, -q, -v, --color, ...).{{end}}`
)

// hideGlobalFlags sets the help of root and its commands.
func hideGlobalFlags(root *cobra.Command) {
	tmpl := root.UsageTemplate()
	if !strings.Contains(tmpl, localFlags) || !strings.Contains(tmpl, inheritedFlags) {
		return // another cobra: keep its listing
	}
	tmpl = strings.Replace(tmpl, localFlags, ownFlagsOnly, 1)
	root.SetUsageTemplate(strings.Replace(tmpl, inheritedFlags, globalFlagsNote, 1))
}

// nameInHelp makes the help of root and every command below name the
// plugin as the user runs it (version.Command), where the texts, written
// for the binary kubectl-migrate, say "kubectl migrate".
func nameInHelp(root *cobra.Command) {
	name := version.Command()
	if name == version.DefaultCommand {
		return
	}
	rename := func(s string) string { return strings.ReplaceAll(s, version.DefaultCommand, name) }
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		c.Short, c.Long, c.Example = rename(c.Short), rename(c.Long), rename(c.Example)
		for _, fs := range []*pflag.FlagSet{c.LocalNonPersistentFlags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { f.Usage = rename(f.Usage) })
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	root.SetUsageTemplate(rename(root.UsageTemplate()))
}

// NewCmdOptions returns kubectl migrate options.
func NewCmdOptions(o *RootOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "options",
		Short: "List the flags every command takes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(o.Out, "The following options can be passed to any command:\n\n%s", cmd.Root().PersistentFlags().FlagUsages())
			return err
		},
	}
}
