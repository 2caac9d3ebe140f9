package plugin

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// NewCmdVersion prints the build's version.
func NewCmdVersion(o *RootOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version of kubectl-migrate",
		Example: "  kubectl migrate version",
		Args:    cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintf(o.Out, "kubectl-migrate %s (commit %s, built %s)\n", version.Version, version.Commit, version.Date)
			return err
		},
	}
}
