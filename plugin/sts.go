package plugin

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

const stsExample = `  # Move ordinal 0 of StatefulSet consumer to node-b, keeping its identity
  kubectl migrate sts consumer-0 --to node-b

  # The same, naming the StatefulSet and the ordinal
  kubectl migrate sts sts/consumer --ordinal 0 --to node-b

  # Near-zero downtime through a shadow copy
  kubectl migrate sts consumer-0 --to node-b --mode shadow

  # The stop-and-copy baseline
  kubectl migrate sts consumer-0 --to node-b --strategy stop-and-copy

  # A StatefulSet of software without the MS2M contract (checkpoint/restore)
  kubectl migrate sts redis-0 --to node-b

  # Nodes whose runtime cannot restore (containerd 2.4): set up the
  # kubectl-migrate runtime on both, as a rollback restores on the source
  kubectl migrate node-setup node-a node-b
  kubectl migrate sts consumer-0 --to node-b --restore runtime`

var stsLong = `Live-migrate one pod of a StatefulSet to another node, keeping its name,
ordinal, labels and volume claims. While the name changes hands the
StatefulSet is deleted with its pods orphaned and created again from its
saved spec, which adopts the moved pod: its spec ends exactly as before.

--mode sequential (the default) stops the source after its checkpoint (cuts
it off the network, for a pod without the MS2M contract, such as a Redis)
and restores it under the same name on the target. --mode shadow (MS2M only)
moves it first into NAME-ORDINAL-shadow on the target while it serves, then
into its own name: two switchovers of milliseconds (a claim then needs a
ReadWriteMany volume). A node-local volume is refused before any change. On
failure the StatefulSet and its pod come back on the source node.

More: ` + version.DocsURL("how-it-works.md")

// StsOptions are the options of kubectl migrate sts.
type StsOptions struct {
	migrationFlags

	Mode     string
	Ordinal  int
	transfer string

	statefulSet string
}

// NewCmdSts returns kubectl migrate sts.
func NewCmdSts(root *RootOptions) *cobra.Command {
	o := &StsOptions{migrationFlags: migrationFlags{RootOptions: root}}
	cmd := &cobra.Command{
		Use:               "sts NAME-ORDINAL --to NODE",
		Aliases:           []string{"statefulset"},
		Short:             "Live-migrate a StatefulSet pod, keeping its identity",
		Long:              stsLong,
		Example:           stsExample,
		Args:              exactlyOne("the pod: " + version.Command() + " sts NAME-ORDINAL --to NODE, or sts/NAME --ordinal N"),
		ValidArgsFunction: completePods(root),
		RunE:              runE(o),
	}
	o.add(cmd)
	o.Ordinal = -1
	cmd.Flags().Var((*ordinalFlag)(&o.Ordinal), "ordinal", "the pod's ordinal, with sts/NAME")
	cmd.Flags().StringVar(&o.Mode, "mode", string(migrate.Sequential), "sequential (the source goes before its copy exists) or shadow (through a shadow copy, near-zero downtime)")
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{string(migrate.Sequential), string(migrate.Shadow)}, cobra.ShellCompDirectiveNoFileComp))
	// Only the registry, or --restore runtime, carries a StatefulSet pod's
	// checkpoint: kept to say why, out of --help.
	cmd.Flags().StringVar(&o.transfer, "transfer", string(migrate.ViaRegistry), "")
	_ = cmd.Flags().MarkHidden("transfer")
	return cmd
}

// Complete reads NAME-ORDINAL or sts/NAME --ordinal N.
func (o *StsOptions) Complete(args []string) error {
	name, pod, err := parseStsArg(args[0], o.Ordinal)
	if err != nil {
		return err
	}
	o.statefulSet = name
	return o.complete(pod)
}

// Validate checks the flags before anything talks to the cluster.
func (o *StsOptions) Validate() error {
	if o.transfer != string(migrate.ViaRegistry) {
		return fmt.Errorf("--transfer %s is for bare pods: a StatefulSet pod's rollback restores its source from the checkpoint image on the source node, so the image must be in a registry both nodes pull from; give --registry, or --restore runtime (which sends it node to node)", o.transfer)
	}
	return o.validate(o)
}

// Run migrates the StatefulSet pod.
func (o *StsOptions) Run(ctx context.Context) error { return o.run(ctx, o) }

// toConfig is the engine's config for migrating the StatefulSet pod (nil:
// the flags alone), which keeps its name.
func (o *StsOptions) toConfig(pod *corev1.Pod, id string) (migrate.Config, error) {
	c, err := o.migrationFlags.toConfig(pod, id)
	c.StatefulSet, c.Mode, c.TargetName = o.statefulSet, migrate.StatefulSetMode(o.Mode), o.pod
	withoutRegistry(&c)
	return c, err
}

// ordinalFlag is --ordinal: unset (-1) until given, and shown in --help
// with no default.
type ordinalFlag int

func (f *ordinalFlag) String() string {
	if *f < 0 {
		return ""
	}
	return strconv.Itoa(int(*f))
}

func (f *ordinalFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not an ordinal: give 0, 1, 2…", s)
	}
	*f = ordinalFlag(n)
	return nil
}

func (f *ordinalFlag) Type() string { return "int" }

// parseStsArg reads NAME-ORDINAL, or sts/NAME with --ordinal.
func parseStsArg(arg string, ordinal int) (statefulSet, pod string, err error) {
	for _, prefix := range []string{"sts/", "statefulset/", "statefulsets/", "statefulset.apps/"} {
		if name, ok := strings.CutPrefix(arg, prefix); ok {
			if ordinal < 0 {
				return "", "", fmt.Errorf("%s names a StatefulSet; give the pod's ordinal with --ordinal N", arg)
			}
			return name, fmt.Sprintf("%s-%d", name, ordinal), nil
		}
	}
	i := strings.LastIndexByte(arg, '-')
	n, convErr := strconv.Atoi(arg[i+1:])
	if i <= 0 || convErr != nil || n < 0 {
		return "", "", fmt.Errorf("%q is not NAME-ORDINAL; give the pod (e.g. consumer-0) or sts/NAME --ordinal N", arg)
	}
	if ordinal >= 0 && ordinal != n {
		return "", "", fmt.Errorf("%s is ordinal %d, but --ordinal says %d", arg, n, ordinal)
	}
	return arg[:i], arg, nil
}
