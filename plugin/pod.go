package plugin

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

const podExample = `  # Move pod consumer to node-b with MS2M; broker and registry come from the
  # pod's ms2m.io/* annotations
  kubectl migrate pod consumer --to node-b

  # The same, naming the registry and broker explicitly
  kubectl migrate pod consumer --to node-b --registry registry.example:5000/checkpoints \
    --broker-url amqp://user:pass@rabbitmq.example:5672/ --exchange orders --queue orders.work

  # At a message rate close to what the target can process, keep replay
  # within 5s with the threshold cutoff
  kubectl migrate pod consumer --to node-b --replay-max 5s

  # The stop-and-copy baseline, for comparison
  kubectl migrate pod consumer --to node-b --strategy stop-and-copy

  # Any other process (no MS2M contract, no broker): checkpoint/restore,
  # chosen by default for a pod without the ms2m.io/queue annotation
  kubectl migrate pod redis-0 --to node-b --transfer direct

  # Check everything and print the plan without changing anything
  kubectl migrate pod consumer --to node-b --dry-run

  # No registry: the checkpoint goes straight from node to node
  kubectl migrate pod consumer --to node-b --transfer direct

  # A target whose runtime does not restore (containerd 2.4): the
  # kubectl-migrate runtime restores, from no image at all
  kubectl migrate pod consumer --to node-b --restore runtime

  # Machine-readable result
  kubectl migrate pod consumer --to node-b -o json`

var podLong = `Live-migrate a running pod's containers to another node: a bare pod, or a
Deployment's (its ReplicaSet adopts the copy, never starting a cold one).

With --strategy ms2m (the default for a pod with the ms2m.io/* annotations)
the source serves while each container is checkpointed, sent (--registry, or
--transfer direct) and restored; the copy replays what it missed and takes
over the queue. --replay-max stops the source early when messages arrive
nearly as fast as the target handles them. Any other pod moves with
checkpoint-restore: cut off the network, checkpointed, restored, given its
labels; its clients wait for the whole move and reconnect, no broker. On failure or
Ctrl-C everything is rolled back; once the target took over, it completes.
Checkpoints hold the process's memory: deleted after success.

More: ` + version.DocsURL("")

// PodOptions are the options of kubectl migrate pod.
type PodOptions struct {
	migrationFlags

	TargetName string
	Transfer   string
	ReplayMax  time.Duration
	Cutoff     time.Duration
}

// NewCmdPod returns kubectl migrate pod.
func NewCmdPod(root *RootOptions) *cobra.Command {
	o := &PodOptions{migrationFlags: migrationFlags{RootOptions: root}}
	cmd := &cobra.Command{
		Use:               "pod NAME --to NODE",
		Short:             "Live-migrate a pod to another node",
		Long:              podLong,
		Example:           podExample,
		Args:              exactlyOne("the pod's name: " + version.Command() + " pod NAME --to NODE"),
		ValidArgsFunction: completePods(root),
		RunE:              runE(o),
	}
	o.add(cmd)
	f := cmd.Flags()
	f.StringVar(&o.TargetName, "target-name", "", "name of the restored pod (default: the original name plus the migration ID)")
	f.DurationVar(&o.ReplayMax, "replay-max", 0, "threshold cutoff: keep replay within this; the source stops T_cutoff = replay-max·μ/λ after the replay queue is bound (λ, μ measured)")
	f.DurationVar(&o.Cutoff, "cutoff", 0, "stop the source this long after the replay queue is bound, whatever the rates (overrides the computed T_cutoff)")
	f.StringVar(&o.Transfer, "transfer", "", "registry (the default): push checkpoint images to --registry; direct (the default with --restore runtime): stream them from the source node's agent to the target node's, no registry (with --restore cri the target node's runtime must pull from localhost:8091 over plain HTTP)")
	_ = cmd.RegisterFlagCompletionFunc("transfer", cobra.FixedCompletions([]string{"registry", "direct"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// Complete takes the pod's name.
func (o *PodOptions) Complete(args []string) error { return o.complete(args[0]) }

// Validate checks the flags before anything talks to the cluster.
func (o *PodOptions) Validate() error { return o.validate(o) }

// Run migrates the pod.
func (o *PodOptions) Run(ctx context.Context) error { return o.run(ctx, o) }

// toConfig is the engine's config for migrating pod (nil: the flags alone,
// for validation) as migration id.
func (o *PodOptions) toConfig(pod *corev1.Pod, id string) (migrate.Config, error) {
	c, err := o.migrationFlags.toConfig(pod, id)
	if err != nil {
		return c, err
	}
	c.TargetName = o.TargetName
	if c.TargetName == "" && pod != nil {
		c.TargetName = targetName(pod, id)
	}
	c.Transfer = migrate.Transfer(cmp.Or(o.Transfer, string(migrate.ViaRegistry)))
	if c.Restore == migrate.RestoreRuntime && c.Transfer == migrate.ViaRegistry && o.Transfer != "" {
		return c, fmt.Errorf("--restore runtime sends the checkpoint node to node, with no registry: drop --transfer %s", o.Transfer)
	}
	if o.Transfer == string(migrate.ViaRegistry) && (c.Restore == "" || c.Restore == migrate.RestoreAuto) {
		// A registry asked for: its image is the container runtime's to
		// restore, where auto would pick the kubectl-migrate runtime.
		c.Restore = migrate.RestoreCRI
	}
	withoutRegistry(&c)
	c.ReplayMax, c.Cutoff = o.ReplayMax, o.Cutoff
	return c, nil
}

func targetName(pod *corev1.Pod, id string) string {
	base := firstOf(pod.Annotations[migrate.OriginalNameAnnotation], pod.Name)
	const maxLen = 63 // a pod's hostname is its name, and a hostname label is at most 63
	if len(base)+1+len(id) > maxLen {
		base = strings.TrimRight(base[:maxLen-1-len(id)], "-.")
	}
	return base + "-" + id
}

func firstPullSecret(pod *corev1.Pod) string {
	if len(pod.Spec.ImagePullSecrets) > 0 {
		return pod.Spec.ImagePullSecrets[0].Name
	}
	return ""
}

func firstOf(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}

func parseLabels(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	labels := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q is not key=value", kv)
		}
		labels[k] = v
	}
	return labels, nil
}
