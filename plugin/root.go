// Package plugin holds the kubectl-migrate commands: cobra wiring, flags and
// output only. Each command has an options struct with Complete, Validate
// and Run; the work is done by the engine in pkg/migrate.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/charmbracelet/colorprofile"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubeconfig auth plugins (OIDC, exec, …)
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// RootOptions are the flags every command shares.
type RootOptions struct {
	ConfigFlags *genericclioptions.ConfigFlags
	genericiooptions.IOStreams
	Color     string
	Verbosity int
	Quiet     bool
	// Environ is the environment colour detection reads (NO_COLOR, TERM…).
	Environ []string
	// NewClient builds the Kubernetes client; tests replace it.
	NewClient func() (kubernetes.Interface, error)
	// NewDeps builds a migration's outside systems (pullSecrets are the
	// migrated pod's); tests replace it.
	NewDeps func(ctx context.Context, client kubernetes.Interface, cfg migrate.Config, pullSecrets []corev1.LocalObjectReference) (migrate.Deps, error)
	// recoverHint is the command that recovers the running migration, for
	// an interrupt that stops the process before its rollback ends.
	recoverHint atomic.Pointer[string]
}

// NewRootOptions returns options that talk to the cluster of the kubeconfig.
func NewRootOptions(streams genericiooptions.IOStreams) *RootOptions {
	o := &RootOptions{
		ConfigFlags: genericclioptions.NewConfigFlags(true),
		IOStreams:   streams,
		Environ:     os.Environ(),
		NewDeps:     realDeps,
	}
	o.NewClient = func() (kubernetes.Interface, error) {
		// With no kubeconfig at all, client-go falls back to
		// localhost:8080, and the error would name that address instead
		// of the cause.
		raw, err := o.ConfigFlags.ToRawKubeConfigLoader().RawConfig()
		if err == nil && len(raw.Clusters) == 0 && !inCluster() && ptr.Deref(o.ConfigFlags.APIServer, "") == "" {
			return nil, errors.New("no kubeconfig found: set KUBECONFIG, pass --kubeconfig, or create ~/.kube/config")
		}
		rc, err := o.ConfigFlags.ToRESTConfig()
		if err != nil {
			return nil, err
		}
		// client-go's default (5 requests/s, bursts of 10) throttles a
		// migration's polls of the application (10/s) and so its critical
		// path; the API server's priority and fairness protects it instead.
		rc.QPS, rc.Burst = 50, 100
		return kubernetes.NewForConfig(rc)
	}
	return o
}

// inCluster reports whether the process runs in a pod, where client-go
// uses the pod's service account without a kubeconfig.
func inCluster() bool {
	return os.Getenv("KUBERNETES_SERVICE_HOST") != "" && os.Getenv("KUBERNETES_SERVICE_PORT") != ""
}

// NewRootCmd returns the kubectl-migrate command tree.
func NewRootCmd(streams genericiooptions.IOStreams) *cobra.Command {
	return NewRootCmdFor(NewRootOptions(streams))
}

// NewRootCmdFor returns the command tree for o.
func NewRootCmdFor(o *RootOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kubectl-migrate",
		Short: "Live-migrate stateful pods between nodes",
		Long: `Live-migrate stateful pods between Kubernetes nodes with MS2M: checkpoint the
running container through the kubelet, restore it on another node, and replay
the messages it missed from a replay queue, so the source keeps serving until
a short switchover.

` + exitCodesHelp,
		Annotations:       map[string]string{cobra.CommandDisplayNameAnnotation: version.Command()},
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validateColor(); err != nil {
				return usageError(cmd, err)
			}
			return nil
		},
	}
	cmd.SetFlagErrorFunc(usageError) // the subcommands inherit it
	o.ConfigFlags.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVar(&o.Color, "color", "auto", "colour output: auto, always or never (NO_COLOR is honoured)")
	cmd.PersistentFlags().IntVarP(&o.Verbosity, "verbose", "v", 0, "verbosity: 1 shows progress inside phases")
	cmd.PersistentFlags().BoolVarP(&o.Quiet, "quiet", "q", false, "print no progress on stderr")
	cmd.AddCommand(NewCmdPod(o), NewCmdSts(o), NewCmdNode(o), NewCmdCheck(o), NewCmdNodeSetup(o), NewCmdConformance(o), NewCmdRecover(o), NewCmdReport(o), NewCmdControlToken(o), NewCmdVersion(o), NewCmdOptions(o))
	hideGlobalFlags(cmd)
	nameInHelp(cmd)
	return cmd
}

func (o *RootOptions) validateColor() error {
	switch o.Color {
	case "auto", "always", "never":
		return nil
	}
	return fmt.Errorf("--color must be auto, always or never, not %q", o.Color)
}

// colourWriter wraps w so colour is downsampled for the terminal or stripped.
func (o *RootOptions) colourWriter(w io.Writer) *colorprofile.Writer {
	cw := colorprofile.NewWriter(w, o.Environ)
	switch o.Color {
	case "always":
		cw.Profile = colorprofile.TrueColor
	case "never":
		cw.Profile = colorprofile.NoTTY
	}
	return cw
}

// command is the shape of every command's options.
type command interface {
	Complete(args []string) error
	Validate() error
	Run(ctx context.Context) error
}

// runE runs Complete, Validate and Run in order: flags are checked before
// anything talks to the cluster, and a bad one exits with ExitUsage.
func runE(o command) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := o.Complete(args); err != nil {
			return usageError(cmd, err)
		}
		if err := o.Validate(); err != nil {
			return usageError(cmd, err)
		}
		return o.Run(cmd.Context())
	}
}

// InterruptNotice is what the first interrupt says: a running migration
// rolls back; any other command (report, check before its links) just
// stops.
func (o *RootOptions) InterruptNotice() string {
	if o.RecoverHint() != "" {
		return "rolling back; interrupt again to stop at once"
	}
	return "stopping"
}

// RecoverHint is what to tell a user whose second interrupt stops the
// process: the command that finishes or undoes the migration it ran.
func (o *RootOptions) RecoverHint() string {
	if h := o.recoverHint.Load(); h != nil {
		return *h
	}
	return ""
}
