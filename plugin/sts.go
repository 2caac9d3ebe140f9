package plugin

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

const stsExample = `  # Move ordinal 0 of StatefulSet consumer to node-b, keeping its identity
  kubectl migrate sts consumer-0 --to node-b

  # The same, naming the StatefulSet and the ordinal
  kubectl migrate sts sts/consumer --ordinal 0 --to node-b

  # Near-zero downtime through a shadow copy
  kubectl migrate sts consumer-0 --to node-b --mode shadow

  # The stop-and-copy baseline
  kubectl migrate sts consumer-0 --to node-b --strategy stop-and-copy`

const stsLong = `Live-migrate one pod of a StatefulSet to another node, keeping its name,
ordinal, labels and volume claims.

A StatefulSet pod's identity cannot exist twice, and deleting the pod would
make the StatefulSet controller recreate it on the old node at once. So while
the name changes hands, the StatefulSet is deleted with its pods orphaned and
then created again from its saved spec: the controller adopts the moved pod
and the untouched ordinals, and its spec is exactly as before.

--mode sequential (the default) is the paper's: the source is checkpointed
(after the replay queue is bound, with MS2M) and its image pushed; then the
source stops, its pod is deleted, the checkpoint is restored under the same
name on the target node and replays up to the source's last message. Downtime
spans from the source stopping to the copy catching up: detach, restore and
replay.

--mode shadow (MS2M only) avoids that gap: the source moves into a shadow pod
NAME-ORDINAL-shadow on the target node while it keeps serving (the shadow has
no member name and no pod-name label, so neither the controller nor per-pod
Services take it), and the shadow takes over the queue at an MS2M switchover.
Then the StatefulSet is orphaned, the stopped source deleted, and the shadow
moves the same way into the StatefulSet's name on the same node. Processing
pauses only at the two switchovers; the report shows each gap. It needs twice
the checkpoints and, for a volume claim, a ReadWriteMany volume, as source and
shadow run at once.

Volumes: a claim bound to a node-local volume (local, hostPath, or node
affinity that excludes the target) cannot follow and is refused before
anything changes, as are hostPath and emptyDir volumes of migrated
containers. A claim on network-attached storage follows: the restored pod
mounts the same claim.

On failure the StatefulSet and its pod come back on the source node: if the
source pod was already deleted, its checkpoint (in shadow mode, the shadow's)
is restored there under the same name and catches up before the StatefulSet
is created again.

Everything said in "kubectl migrate pod --help" about registries, secrets,
annotations and requirements applies; RBAC additionally needs get, delete and
create on statefulsets, and get on persistentvolumeclaims and
persistentvolumes for pods with claims.`

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
		Args:              exactlyOne("the pod: kubectl migrate sts NAME-ORDINAL --to NODE, or sts/NAME --ordinal N"),
		ValidArgsFunction: completePods(root),
		RunE:              runE(o),
	}
	o.add(cmd)
	cmd.Flags().IntVar(&o.Ordinal, "ordinal", -1, "the pod's ordinal, with sts/NAME")
	cmd.Flags().StringVar(&o.Mode, "mode", string(migrate.Sequential), "sequential (the source goes before its copy exists) or shadow (through a shadow copy, near-zero downtime)")
	_ = cmd.RegisterFlagCompletionFunc("mode", cobra.FixedCompletions([]string{string(migrate.Sequential), string(migrate.Shadow)}, cobra.ShellCompDirectiveNoFileComp))
	// Only the registry carries a StatefulSet pod's checkpoint: kept to
	// say why, out of --help.
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
		return fmt.Errorf("--transfer %s is for bare pods: a StatefulSet pod's rollback restores its source from the checkpoint image on the source node, so the image must be in a registry both nodes pull from; give --registry", o.transfer)
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
	c.Transfer = migrate.ViaRegistry
	return c, err
}

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
