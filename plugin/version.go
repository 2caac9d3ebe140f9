package plugin

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// versionInfo is version -o json|yaml.
type versionInfo struct {
	Version    string `json:"version"`
	Commit     string `json:"commit"`
	Date       string `json:"date"`
	AgentImage string `json:"agentImage"`
}

// NewCmdVersion prints the build's version.
func NewCmdVersion(o *RootOptions) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print the version of kubectl-migrate",
		Example: "  kubectl migrate version\n  kubectl migrate version -o json\n  kubectl migrate version -o jsonpath='{.version}'",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := validateOutput(output); err != nil {
				return usageError(cmd, err)
			}
			if output == "" {
				_, err := fmt.Fprintf(o.Out, "kubectl-migrate %s (commit %s, built %s)\n", version.Version, version.Commit, version.Date)
				return err
			}
			return printData(o.Out, output, versionInfo{version.Version, version.Commit, version.Date, version.AgentImage()})
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: "+outputFormats+" (default: one line)")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(outputCompletions, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}
