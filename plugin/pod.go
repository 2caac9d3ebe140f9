package plugin

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

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
its archive is deleted from the node once packed, and --delete-image removes
it after success. A restored container that
restarts later is restored again from that image (while the node still has
it): its memory goes back to the checkpoint and, by the contract, it holds
without consuming until told what to do.

Needs: the kubelet's ContainerCheckpoint feature gate (on by default since
1.30), CRI-O ≥ 1.25 or containerd 2.1–2.3 with CRIU on both nodes, a registry
both nodes pull from (or --transfer direct), and RBAC create on nodes/proxy, pods, pods/proxy and
configmaps.`

// PodOptions are the options of kubectl migrate pod.
type PodOptions struct {
	*RootOptions

	To                string
	Containers        []string
	Strategy          string
	Mode              string
	TargetName        string
	Transfer          string
	Registry          string
	RegistrySecret    string
	InsecureRegistry  bool
	AgentImage        string
	BrokerURL         string
	Exchange          string
	Queue             string
	ControlPort       int
	ReplayTimeout     time.Duration
	ReplayMax         time.Duration
	Cutoff            time.Duration
	PhaseTimeout      time.Duration
	CheckpointTimeout time.Duration
	Timeout           time.Duration
	DryRun            bool
	KeepOnFailure     bool
	DeleteImage       bool
	Labels            []string
	Output            string
	InjectFailure     string
	InjectCrash       string

	config migrate.Config
	client kubernetes.Interface
	// stsArg resolves a StatefulSet pod argument (kubectl migrate sts).
	stsArg func(arg string) error
}

// NewCmdPod returns kubectl migrate pod.
func NewCmdPod(root *RootOptions) *cobra.Command {
	o := &PodOptions{RootOptions: root}
	cmd := &cobra.Command{
		Use:               "pod NAME --to NODE",
		Short:             "Live-migrate a pod to another node",
		Long:              podLong,
		Example:           podExample,
		Args:              exactlyOne("the pod's name: kubectl migrate pod NAME --to NODE"),
		ValidArgsFunction: completePods(root),
		RunE:              runE(o),
	}
	o.addFlags(cmd, true)
	return cmd
}

// addFlags adds the migration flags; a bare pod also gets the ones that
// only apply to it.
func (o *PodOptions) addFlags(cmd *cobra.Command, barePod bool) {
	f := cmd.Flags()
	f.StringVar(&o.To, "to", "", "target node (required)")
	f.StringSliceVarP(&o.Containers, "container", "c", nil, "containers to migrate (default: all)")
	f.StringVar(&o.Strategy, "strategy", string(migrate.MS2M), "ms2m or stop-and-copy")
	f.StringVar(&o.Registry, "registry", "", "repository for checkpoint images, e.g. registry.example:5000/checkpoints (default: the ms2m.io/registry annotation)")
	f.StringVar(&o.RegistrySecret, "registry-secret", "", "dockerconfigjson secret to push and pull with (default: the pod's first imagePullSecret)")
	f.BoolVar(&o.InsecureRegistry, "insecure-registry", false, "allow a plain-HTTP or self-signed registry")
	f.StringVar(&o.AgentImage, "agent-image", version.AgentImage(), "image of the node-side agent that packs and pushes checkpoints")
	f.StringVar(&o.BrokerURL, "broker-url", "", "AMQP URL this machine reaches the broker at (default: the ms2m.io/broker-url annotation)")
	f.StringVar(&o.Exchange, "exchange", "", "the workload's fanout exchange (default: the ms2m.io/exchange annotation)")
	f.StringVar(&o.Queue, "queue", "", "the pod's primary queue (default: the ms2m.io/queue annotation)")
	f.IntVar(&o.ControlPort, "control-port", 0, "port of the MS2M HTTP endpoint (default: the ms2m.io/control-port annotation, else 8080)")
	f.DurationVar(&o.ReplayTimeout, "replay-timeout", 5*time.Minute, "how long the target may take to catch up before the migration rolls back")
	f.DurationVar(&o.PhaseTimeout, "phase-timeout", 3*time.Minute, "time limit of every other phase")
	f.DurationVar(&o.CheckpointTimeout, "checkpoint-timeout", time.Minute, "time the kubelet gives the runtime for one checkpoint")
	f.DurationVar(&o.Timeout, "timeout", 15*time.Minute, "time limit of the whole migration (rollback gets its own)")
	f.BoolVar(&o.DryRun, "dry-run", false, "run the preflight checks and print the plan; change nothing")
	f.BoolVar(&o.KeepOnFailure, "keep-on-failure", false, "leave everything as it is when the migration fails, for debugging")
	f.BoolVar(&o.DeleteImage, "delete-image", false, "delete the checkpoint images from the registry after success")
	f.StringSliceVar(&o.Labels, "label", nil, "key=value labels stored with the record, to compare runs (e.g. rate=10)")
	f.StringVarP(&o.Output, "output", "o", "", "output format of the result: json or yaml (default: the report)")
	f.StringVar(&o.InjectFailure, "inject-failure", "", "fail this phase (e.g. replay, or replay/final) after it ran, to test rollback")
	_ = f.MarkHidden("inject-failure")
	f.StringVar(&o.InjectCrash, "inject-crash", "", "kill this process (SIGKILL) as this phase starts (e.g. restore, or restore/final), to test recovery")
	_ = f.MarkHidden("inject-crash")
	_ = cmd.RegisterFlagCompletionFunc("to", completeNodes(o.RootOptions))
	_ = cmd.RegisterFlagCompletionFunc("strategy", cobra.FixedCompletions([]string{"ms2m", "stop-and-copy"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	if barePod {
		f.StringVar(&o.TargetName, "target-name", "", "name of the restored pod (default: the original name plus the migration ID)")
		f.DurationVar(&o.ReplayMax, "replay-max", 0, "threshold cutoff: keep replay within this; the source stops T_cutoff = replay-max·μ/λ after the replay queue is bound (λ, μ measured)")
		f.DurationVar(&o.Cutoff, "cutoff", 0, "stop the source this long after the replay queue is bound, whatever the rates (overrides the computed T_cutoff)")
		f.StringVar(&o.Transfer, "transfer", string(migrate.ViaRegistry), "registry: push checkpoint images to --registry; direct: stream them from the source node's agent to the target node's, no registry (the target node's runtime must pull from localhost:8091 over plain HTTP)")
		_ = cmd.RegisterFlagCompletionFunc("transfer", cobra.FixedCompletions([]string{"registry", "direct"}, cobra.ShellCompDirectiveNoFileComp))
	}
}

// Complete resolves the namespace and parses what needs no cluster.
func (o *PodOptions) Complete(args []string) error {
	if o.config.StatefulSet == "" && o.stsArg == nil {
		o.config.Pod = args[0]
	} else if err := o.stsArg(args[0]); err != nil {
		return err
	}
	var err error
	if o.config.Namespace, _, err = o.ConfigFlags.ToRawKubeConfigLoader().Namespace(); err != nil {
		return err
	}
	o.config.Labels, err = parseLabels(o.Labels)
	return err
}

// Validate checks the flags before anything talks to the cluster.
func (o *PodOptions) Validate() error {
	if o.To == "" {
		return fmt.Errorf("--to NODE is required: the node to move pod %s to", o.config.Pod)
	}
	if !slices.Contains(migrate.Strategies, migrate.Strategy(o.Strategy)) {
		return fmt.Errorf("--strategy must be one of %v, not %q", migrate.Strategies, o.Strategy)
	}
	if o.stsArg != nil && !slices.Contains(migrate.Modes, migrate.StatefulSetMode(o.Mode)) {
		return fmt.Errorf("--mode must be one of %v, not %q", migrate.Modes, o.Mode)
	}
	if o.ControlPort < 0 || o.ControlPort > 65535 {
		return fmt.Errorf("--control-port %d is not a port", o.ControlPort)
	}
	return validateOutput(o.Output)
}

// Run reads the pod, fills defaults from its annotations, migrates it and
// prints the result.
func (o *PodOptions) Run(ctx context.Context) error {
	client, err := o.NewClient()
	if err != nil {
		return err
	}
	o.client = client
	ns := o.config.Namespace
	source, err := o.client.CoreV1().Pods(ns).Get(ctx, o.config.Pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if id, held := migrate.Holder(ctx, o.client, ns, o.config.Pod); held {
			return fmt.Errorf("pod %s is not there while migration %s, which did not end, holds it; finish or undo that migration: %s", o.config.Pod, id, migrate.RecoverCommand(ns, id))
		}
		return fmt.Errorf("pod %s not found in namespace %s; check the name and -n", o.config.Pod, ns)
	}
	if err != nil {
		return fmt.Errorf("get pod %s: %w", o.config.Pod, err)
	}
	if err := o.configure(source); err != nil {
		return err
	}
	if err := o.config.Validate(); err != nil {
		return err
	}
	deps, err := o.NewDeps(ctx, o.client, o.config, source.Spec.ImagePullSecrets)
	if err != nil {
		return err
	}
	st := newStatus(o.RootOptions)
	hint := "the journal is kept; finish or undo the migration with " + migrate.RecoverCommand(o.config.Namespace, o.config.ID)
	o.recoverHint.Store(&hint)
	record, err := migrate.Run(ctx, o.config, deps, st.hooks(o.InjectCrash))
	if record == nil {
		return err
	}
	if o.DryRun && err == nil {
		return o.printPlan(source)
	}
	if printErr := o.printRecord(record); printErr != nil && err == nil {
		err = printErr
	}
	return err
}

// configure completes the engine's config from the flags and, where a flag
// is not set, the pod's annotations.
func (o *PodOptions) configure(pod *corev1.Pod) error {
	a := pod.Annotations
	c := &o.config
	c.ID = rand.String(5)
	c.Strategy = migrate.Strategy(o.Strategy)
	c.Containers = o.Containers
	c.TargetNode = o.To
	c.TargetName = firstOf(o.TargetName, targetName(pod, c.ID))
	if c.StatefulSet != "" {
		c.TargetName, c.Mode = pod.Name, migrate.StatefulSetMode(o.Mode)
	}
	c.Transfer = migrate.Transfer(firstOf(o.Transfer, string(migrate.ViaRegistry)))
	if c.Transfer != migrate.Direct {
		c.ImageRepository = strings.TrimSuffix(firstOf(o.Registry, a[migrate.RegistryAnnotation]), "/")
	}
	c.RegistrySecret = firstOf(o.RegistrySecret, firstPullSecret(pod))
	c.InsecureRegistry = o.InsecureRegistry
	c.AgentImage = o.AgentImage
	c.Broker = migrate.BrokerConfig{
		URL:      firstOf(o.BrokerURL, a[migrate.BrokerURLAnnotation]),
		Exchange: firstOf(o.Exchange, a[migrate.ExchangeAnnotation]),
		Queue:    firstOf(o.Queue, a[migrate.QueueAnnotation]),
	}
	c.CheckpointTimeout, c.PhaseTimeout, c.ReplayTimeout, c.Timeout = o.CheckpointTimeout, o.PhaseTimeout, o.ReplayTimeout, o.Timeout
	c.ReplayMax, c.Cutoff = o.ReplayMax, o.Cutoff
	c.KeepOnFailure, c.DryRun, c.DeleteImages = o.KeepOnFailure, o.DryRun, o.DeleteImage
	c.InjectFailure = o.InjectFailure
	c.ControlPort = o.ControlPort
	if c.ControlPort == 0 {
		c.ControlPort = 8080
		if v, ok := a[migrate.ControlPortAnnotation]; ok {
			port, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("annotation %s=%q is not a port; fix it or pass --control-port", migrate.ControlPortAnnotation, v)
			}
			c.ControlPort = port
		}
	}
	return nil
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
