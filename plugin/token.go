package plugin

import (
	"context"
	"fmt"
	"path"

	"github.com/spf13/cobra"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// ControlTokenOptions are the options of kubectl migrate control-token.
type ControlTokenOptions struct {
	*RootOptions
	namespace string
}

// NewCmdControlToken returns kubectl migrate control-token.
func NewCmdControlToken(root *RootOptions) *cobra.Command {
	o := &ControlTokenOptions{RootOptions: root}
	return &cobra.Command{
		Use:   "control-token",
		Short: "Create the namespace's control token for its MS2M applications",
		Long: `Create the Secret ` + protocol.ControlSecret + ` with a random token in the namespace, unless it
exists. An MS2M application (contract 4) mounts it at ` + path.Dir(protocol.DefaultTokenFile) + ` and takes
control calls only with its token, which kubectl migrate reads from the
Secret: no pod of another namespace can stop, resume or read it, and a
checkpoint of it restored into a pod of another namespace never consumes.

The token is never printed. To change it, delete the Secret, run this again
and restart the applications: they keep the token they started with.

More: ` + version.DocsURL("contract.md"),
		Example: "  kubectl migrate control-token -n orders",
		Args:    noArgs,
		RunE:    runE(o),
	}
}

// Complete resolves the namespace.
func (o *ControlTokenOptions) Complete([]string) error {
	var err error
	o.namespace, _, err = o.ConfigFlags.ToRawKubeConfigLoader().Namespace()
	return err
}

// Validate has nothing to check.
func (o *ControlTokenOptions) Validate() error { return nil }

// Run creates the Secret unless it exists.
func (o *ControlTokenOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	_, created, err := appctl.EnsureToken(ctx, client, o.namespace)
	if err != nil {
		return err
	}
	if !created {
		_, err = fmt.Fprintf(o.Out, "secret/%s exists in namespace %s: unchanged\n", protocol.ControlSecret, o.namespace)
		return err
	}
	_, err = fmt.Fprintf(o.Out, "secret/%s created in namespace %s: mount it at %s in the applications' pods\n", protocol.ControlSecret, o.namespace, path.Dir(protocol.DefaultTokenFile))
	return err
}
