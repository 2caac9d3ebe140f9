package plugin

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
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

  # Check everything and print the plan without changing anything
  kubectl migrate pod consumer --to node-b --dry-run

  # No registry: the checkpoint goes straight from node to node
  kubectl migrate pod consumer --to node-b --transfer direct

  # Machine-readable result
  kubectl migrate pod consumer --to node-b -o json`

const podLong = `Live-migrate a running pod's containers to another node.

With --strategy ms2m (the default) the source keeps serving throughout: a
replay queue is bound to the workload's exchange, each container is
checkpointed through the kubelet (Forensic Container Checkpointing), packed as
an OCI checkpoint image on the source node and pushed to --registry, restored
on the target node, and the restored copy replays the buffered messages until
it has caught up. Then the source stops, the target takes over the primary
queue, and the source pod, the replay queue and the agent pods are removed.
--strategy stop-and-copy stops the source first and skips replay: the
baseline, whose downtime is about its migration time.

When messages arrive (λ) nearly as fast as the target processes them (μ),
replay may never catch up. --replay-max turns on the threshold cutoff: λ is
measured on the replay queue and μ from the target's own replay, both
re-estimated as replay runs; the source is stopped T_cutoff = replay-max·μ/λ
after the replay queue was bound (at once if λ ≥ μ), the target replays up to
the source's last message and takes over, and later messages wait in the
queue. --cutoff gives a fixed T_cutoff instead.

The workload must follow the MS2M application contract (see the README): an
HTTP endpoint on --control-port for state and control messages, sequence
numbers in messages, and reconnecting to the broker after a restore.

Defaults for the broker and registry are read from annotations on the pod:
  ms2m.io/broker-url    AMQP URL (this machine must reach it; --broker-url overrides)
  ms2m.io/exchange      fanout exchange the producer publishes to
  ms2m.io/queue         the pod's primary queue
  ms2m.io/control-port  port of the MS2M HTTP endpoint (default 8080)
  ms2m.io/registry      repository for checkpoint images

If anything fails, or on Ctrl-C, every phase is rolled back and the source
keeps serving, unless --keep-on-failure is given. Once the target has taken
over the primary queue the migration is committed and only completes.

--transfer direct needs no registry: the source node's agent streams each
checkpoint to the target node's agent (on the node's network, port 8091),
which serves it to its own node's runtime only; the checkpoint never leaves
the two nodes. The target's runtime must pull from localhost:8091 over plain
HTTP (CRI-O: insecure_registries in [crio.image]).

A checkpoint image holds the process's memory, secrets included: it is
pushed only to --registry (or, with --transfer direct, to the target node),
its archive is deleted from the node once packed, and the image (manifest
and blobs) is deleted from the registry after success unless --keep-image.
Images are pushed to REGISTRY/NAMESPACE/POD, so per-path registry rules can
keep each namespace's checkpoints to its own. A restored container that
restarts later is restored again from that image in the node's image store:
its memory goes back to the checkpoint and, by the contract, it holds
without consuming until told what to do.

Needs: the kubelet's ContainerCheckpoint feature gate (on by default since
1.30), CRI-O ≥ 1.25 or containerd 2.1–2.3 with CRIU on both nodes (restore
opted in where it is opt-in: containerd 2.2.7+/2.3.4+, recent CRI-O patch
releases), a registry both nodes pull from (or --transfer direct), and RBAC
create on nodes/proxy, pods, pods/proxy and configmaps. kubectl migrate check
--from NODE --to NODE proves a pair of nodes before the first migration.`

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
		Args:              exactlyOne("the pod's name: kubectl migrate pod NAME --to NODE"),
		ValidArgsFunction: completePods(root),
		RunE:              runE(o),
	}
	o.add(cmd)
	f := cmd.Flags()
	f.StringVar(&o.TargetName, "target-name", "", "name of the restored pod (default: the original name plus the migration ID)")
	f.DurationVar(&o.ReplayMax, "replay-max", 0, "threshold cutoff: keep replay within this; the source stops T_cutoff = replay-max·μ/λ after the replay queue is bound (λ, μ measured)")
	f.DurationVar(&o.Cutoff, "cutoff", 0, "stop the source this long after the replay queue is bound, whatever the rates (overrides the computed T_cutoff)")
	f.StringVar(&o.Transfer, "transfer", string(migrate.ViaRegistry), "registry: push checkpoint images to --registry; direct: stream them from the source node's agent to the target node's, no registry (the target node's runtime must pull from localhost:8091 over plain HTTP)")
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
	c.Transfer = migrate.Transfer(o.Transfer)
	if c.Transfer == migrate.Direct {
		c.ImageRepository = "" // no registry is used
	}
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
