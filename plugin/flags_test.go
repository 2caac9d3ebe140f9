package plugin

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// userFacing are the packages whose strings reach users as errors or help;
// pkg/agent and pkg/ms2m are left out: their flags are the agent's and the
// sample programs' own.
var userFacing = []string{".", "../pkg/migrate", "../pkg/report", "../pkg/appctl", "../pkg/image", "../pkg/kubelet", "../pkg/runtimesupport", "../pkg/broker", "../pkg/kube", "../pkg/check", "../pkg/conformance"}

var flagMention = regexp.MustCompile(`(?:^|[\s(\x60"'])--([a-z][a-z0-9-]+)`)

// TestMentionedFlagsExist: every --flag that an error or help text names is
// one the plugin registers, so a user told to pass it can.
func TestMentionedFlagsExist(t *testing.T) {
	registered := map[string]bool{"help": true}
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags(), c.InheritedFlags()} {
			fs.VisitAll(func(f *pflag.Flag) { registered[f.Name] = true })
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(NewRootCmd(genericiooptions.NewTestIOStreamsDiscard()))
	for _, dir := range userFacing {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			src, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, src, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				for _, m := range flagMention.FindAllStringSubmatch(s, -1) {
					if !registered[m[1]] {
						t.Errorf("%s mentions --%s, which no command registers: %q", file, m[1], s)
					}
				}
				return true
			})
		}
	}
}

var docsLink = regexp.MustCompile(`https://github\.com/kubectl-migrate/kubectl-migrate/tree/main/(docs\S*)$`)

// TestLongHelpIsShortAndLinksItsDocs: a command's --help explains in at most
// 15 lines and points to a page of docs/ that exists for the rest.
func TestLongHelpIsShortAndLinksItsDocs(t *testing.T) {
	for _, c := range NewRootCmd(genericiooptions.NewTestIOStreamsDiscard()).Commands() {
		if c.Long == "" || c.Hidden {
			continue
		}
		lines := strings.Split(strings.TrimSpace(c.Long), "\n")
		if len(lines) > 15 {
			t.Errorf("%s: Long has %d lines, at most 15", c.Name(), len(lines))
		}
		if c.Name() == "version" || c.Name() == "options" || c.Name() == "completion" {
			continue
		}
		m := docsLink.FindStringSubmatch(lines[len(lines)-1])
		if m == nil {
			t.Errorf("%s: Long does not end with a link into docs/: %q", c.Name(), lines[len(lines)-1])
			continue
		}
		if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
			t.Errorf("%s: Long links %s, which is not in the repository", c.Name(), m[1])
		}
	}
}
