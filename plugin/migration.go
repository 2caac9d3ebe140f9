package plugin

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/broker"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// migrationFlags are the flags kubectl migrate pod and sts share, and what
// the two commands do alike: read the pod, turn flags and the pod's
// annotations into the engine's config, migrate, print.
type migrationFlags struct {
	*RootOptions

	To                string
	Containers        []string
	Strategy          string
	Registry          string
	RegistrySecret    string
	InsecureRegistry  bool
	AgentImage        string
	AgentNamespace    string
	BrokerURL         string
	BrokerSecret      string
	Exchange          string
	Queue             string
	ControlPort       int
	ReplayTimeout     time.Duration
	PhaseTimeout      time.Duration
	KubeletTimeout    time.Duration
	CheckpointTimeout time.Duration
	Timeout           time.Duration
	DryRun            bool
	dryRunMode        string
	readOnly          bool
	KeepOnFailure     bool
	KeepImage         bool
	AllowAnonymous    bool
	MaxVolumeData     string
	Restore           string
	Pages             string
	DeleteImage       bool // before images were deleted by default
	Labels            []string
	Output            string
	InjectFailure     string
	InjectCrash       string

	namespace string
	pod       string
	labels    map[string]string
}

// migrationCommand is pod's or sts's options: the shared flags and the
// config they make for a pod.
type migrationCommand interface {
	toConfig(pod *corev1.Pod, id string) (migrate.Config, error)
}

func (f *migrationFlags) add(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.To, "to", "", "target node (required)")
	fs.StringSliceVarP(&f.Containers, "container", "c", nil, "containers to migrate (default: all)")
	fs.StringVar(&f.Strategy, "strategy", "", "ms2m (the default for a pod with the MS2M contract: its ms2m.io/queue annotation, or a queue given), stop-and-copy, or checkpoint-restore (the default otherwise: any process CRIU can move, no broker; its clients wait while it moves and reconnect)")
	fs.StringVar(&f.Registry, "registry", "", "repository for checkpoint images, e.g. registry.example:5000/checkpoints (default: the ms2m.io/registry annotation)")
	fs.StringVar(&f.RegistrySecret, "registry-secret", "", "dockerconfigjson secret to push and pull with (default: the pod's first imagePullSecret)")
	fs.BoolVar(&f.InsecureRegistry, "insecure-registry", false, "allow a plain-HTTP or self-signed registry")
	fs.StringVar(&f.AgentImage, "agent-image", version.AgentImage(), "image of the node-side agent that packs and pushes checkpoints")
	addAgentNamespaceFlag(fs, &f.AgentNamespace)
	fs.StringVar(&f.BrokerURL, "broker-url", "", "AMQP URL this machine reaches the broker at (default: the ms2m.io/broker-url annotation); its password is better given by --broker-secret or $"+brokerPasswordEnv)
	fs.StringVar(&f.BrokerSecret, "broker-secret", "", "Secret in the pod's namespace with the broker's username and password keys (default: the ms2m.io/broker-secret annotation)")
	fs.StringVar(&f.Exchange, "exchange", "", "the workload's fanout exchange (default: the ms2m.io/exchange annotation)")
	fs.StringVar(&f.Queue, "queue", "", "the pod's primary queue (default: the ms2m.io/queue annotation)")
	fs.IntVar(&f.ControlPort, "control-port", 0, "port of the MS2M HTTP endpoint (default: the ms2m.io/control-port annotation, else 8080)")
	fs.DurationVar(&f.ReplayTimeout, "replay-timeout", 5*time.Minute, "how long the target may take to catch up before the migration rolls back")
	fs.DurationVar(&f.PhaseTimeout, "phase-timeout", 3*time.Minute, "time limit of every other phase")
	fs.DurationVar(&f.KubeletTimeout, "kubelet-timeout", 15*time.Second, "how long a node's kubelet may not answer before the migration stops waiting for it (a target it never starts rolls back)")
	fs.DurationVar(&f.CheckpointTimeout, "checkpoint-timeout", time.Minute, "time the kubelet gives the runtime for one checkpoint")
	fs.DurationVar(&f.Timeout, "timeout", 15*time.Minute, "time limit of the whole migration (rollback gets its own)")
	fs.StringVar(&f.dryRunMode, "dry-run", "none", "none migrates; client (a bare --dry-run) runs the preflight checks, only reading the cluster, and prints the plan; server also starts the agents, checks the target's runtime through them and predicts the timings, removing them again")
	fs.Lookup("dry-run").NoOptDefVal = "client"
	fs.BoolVar(&f.KeepOnFailure, "keep-on-failure", false, "leave everything as it is when the migration fails, for debugging")
	fs.BoolVar(&f.KeepImage, "keep-image", false, "keep the checkpoint images in the registry after success (they hold the process's memory, and are deleted by default)")
	fs.BoolVar(&f.AllowAnonymous, "allow-anonymous-checkpoints", false, "let the checkpoint image go through a registry without --registry-secret: any pod on the target node may then run it, and anyone who reaches the registry read it (refused by default)")
	fs.StringVar(&f.MaxVolumeData, "max-volume-data", "1Gi", "the most emptyDir data the migrated containers' volumes may hold; it is copied to the target, and more is refused before any change")
	fs.StringVar(&f.Restore, "restore", string(migrate.RestoreAuto), "cri: the target's container runtime restores from a checkpoint image; runtime: the kubectl-migrate runtime (kubectl migrate node-setup) restores from the checkpoint sent node to node, no image (containerd 2.4+); auto: runtime where installed, else cri")
	_ = cmd.RegisterFlagCompletionFunc("restore", cobra.FixedCompletions([]string{"auto", "cri", "runtime"}, cobra.ShellCompDirectiveNoFileComp))
	fs.StringVar(&f.Pages, "pages", string(migrate.PagesEager), "experimental: "+"eager: the checkpoint holds the whole memory (the freeze grows with it); lazy: the memory stays in the frozen source while the copy runs on the target and faults it in, the rest following over the agents' stream (MS2M, whose copy replays meanwhile, or stop-and-copy, of a pod under RuntimeClass kubectl-migrate, the runtime on both nodes)")
	_ = cmd.RegisterFlagCompletionFunc("pages", cobra.FixedCompletions([]string{"eager", "lazy"}, cobra.ShellCompDirectiveNoFileComp))
	_ = fs.MarkHidden("pages") // experimental (experimentalEnv)
	fs.BoolVar(&f.DeleteImage, "delete-image", true, "")
	_ = fs.MarkDeprecated("delete-image", "checkpoint images are deleted by default now; --keep-image keeps them")
	fs.StringSliceVar(&f.Labels, "label", nil, "key=value labels stored with the record, to compare runs (e.g. rate=10)")
	fs.StringVarP(&f.Output, "output", "o", "", "output format of the result: name, "+outputFormats+" (default: the report)")
	fs.StringVar(&f.InjectFailure, "inject-failure", "", "fail this phase (e.g. replay, or replay/final) after it ran, to test rollback")
	_ = fs.MarkHidden("inject-failure")
	fs.StringVar(&f.InjectCrash, "inject-crash", "", "kill this process (SIGKILL) as this phase starts (e.g. restore, or restore/final), to test recovery")
	_ = fs.MarkHidden("inject-crash")
	_ = cmd.RegisterFlagCompletionFunc("to", completeNodes(f.RootOptions))
	_ = cmd.RegisterFlagCompletionFunc("strategy", cobra.FixedCompletions([]string{"ms2m", "stop-and-copy", "checkpoint-restore"}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(append([]string{outputName}, outputCompletions...), cobra.ShellCompDirectiveNoFileComp))
}

// addAgentNamespaceFlag adds --agent-namespace, where the commands that
// start agents start them.
func addAgentNamespaceFlag(fs *pflag.FlagSet, ns *string) {
	fs.StringVar(ns, "agent-namespace", agent.DefaultNamespace, "namespace the node-side agents run in (root, host paths: a namespace of their own, created with Pod Security level privileged when missing)")
}

// complete takes the pod's name and resolves the namespace.
func (f *migrationFlags) complete(pod string) error {
	f.pod = pod
	var err error
	if f.namespace, _, err = f.ConfigFlags.ToRawKubeConfigLoader().Namespace(); err != nil {
		return err
	}
	f.labels, err = parseLabels(f.Labels)
	if err != nil {
		return err
	}
	f.DryRun, f.readOnly, err = parseDryRun(f.dryRunMode)
	return err
}

// parseDryRun reads --dry-run as kubectl does: none, client or server.
// Client only reads the cluster (preflight); server also starts the agents,
// checks the target's runtime through them and predicts, removing all of it
// again: neither changes the workload.
func parseDryRun(mode string) (dryRun, readOnly bool, err error) {
	switch mode {
	case "none", "false", "":
		return false, false, nil
	case "client", "true":
		return true, true, nil
	case "server":
		return true, false, nil
	}
	return false, false, fmt.Errorf("--dry-run must be none, client or server, not %q", mode)
}

// validate checks what the flags alone decide, with the engine's own rules,
// before anything talks to the cluster.
func (f *migrationFlags) validate(mc migrationCommand) error {
	c, err := mc.toConfig(nil, "")
	if err != nil {
		return err
	}
	if err := c.ValidateChoices(); err != nil {
		return err
	}
	if c.Pages == migrate.PagesLazy && !slices.Contains(strings.Split(f.getenv(experimentalEnv), ","), "lazy-pages") {
		return fmt.Errorf("--pages lazy is experimental (docs/runtime.md says what is proven); to use it, set %s=lazy-pages", experimentalEnv)
	}
	return validateNamedOutput(f.Output)
}

// experimentalEnv lists, comma-separated, the experimental features a
// user opts into.
const experimentalEnv = "KUBECTL_MIGRATE_EXPERIMENTAL"

// toConfig turns the flags and, where a flag is not set, the pod's
// annotations into the engine's config for migration id; with pod nil, the
// flags alone. It is pure: the one place flags become a config.
func (f *migrationFlags) toConfig(pod *corev1.Pod, id string) (migrate.Config, error) {
	var a map[string]string
	var pullSecret string
	if pod != nil {
		a = pod.Annotations
		pullSecret = firstPullSecret(pod)
	}
	c := migrate.Config{
		ID: id, Strategy: f.strategy(pod), Namespace: f.namespace, Pod: f.pod,
		Containers: f.Containers, TargetNode: f.To,
		ImageRepository:  strings.TrimSuffix(firstOf(f.Registry, a[migrate.RegistryAnnotation]), "/"),
		RegistrySecret:   firstOf(f.RegistrySecret, pullSecret),
		InsecureRegistry: f.InsecureRegistry,
		AgentImage:       f.AgentImage,
		AgentNamespace:   f.AgentNamespace,
		Broker: migrate.BrokerConfig{
			URL:      firstOf(f.BrokerURL, a[migrate.BrokerURLAnnotation]),
			Exchange: firstOf(f.Exchange, a[migrate.ExchangeAnnotation]),
			Queue:    podQueue(firstOf(f.Queue, a[migrate.QueueAnnotation]), pod),
		},
		ControlPort:       f.ControlPort,
		CheckpointTimeout: f.CheckpointTimeout, PhaseTimeout: f.PhaseTimeout, ReplayTimeout: f.ReplayTimeout, Timeout: f.Timeout,
		KubeletTimeout: f.KubeletTimeout,
		KeepOnFailure:  f.KeepOnFailure, DryRun: f.DryRun, ReadOnly: f.readOnly, KeepImages: f.KeepImage, AllowAnonymousCheckpoints: f.AllowAnonymous,
		Labels: f.labels, InjectFailure: f.InjectFailure,
		Restore: migrate.Restore(f.Restore), Transfer: migrate.ViaRegistry, Pages: migrate.Pages(f.Pages),
	}
	if f.MaxVolumeData != "" {
		q, err := resource.ParseQuantity(f.MaxVolumeData)
		if err != nil || q.Sign() <= 0 {
			return c, fmt.Errorf("--max-volume-data %q is not a positive size; give one like 512Mi or 2Gi", f.MaxVolumeData)
		}
		c.MaxVolumeBytes = q.Value()
	}
	if f.BrokerURL == "" {
		if err := broker.CheckAnnotatedURL(c.Broker.URL); err != nil {
			return c, fmt.Errorf("the pod's %s annotation %w; pass --broker-url to use them", migrate.BrokerURLAnnotation, err)
		}
	}
	if c.ControlPort == 0 {
		c.ControlPort = 8080
		if v, ok := a[migrate.ControlPortAnnotation]; ok {
			port, err := strconv.Atoi(v)
			if err != nil {
				return c, fmt.Errorf("annotation %s=%q is not a port; fix it or pass --control-port", migrate.ControlPortAnnotation, v)
			}
			c.ControlPort = port
		}
	}
	return c, nil
}

// strategy is --strategy, or else the pod's: MS2M for a pod that carries
// the contract (its queue annotated, or given), checkpoint/restore for any
// other. With pod nil (the flags alone), MS2M's rules are checked.
func (f *migrationFlags) strategy(pod *corev1.Pod) migrate.Strategy {
	switch {
	case f.Strategy != "":
		return migrate.Strategy(f.Strategy)
	case pod == nil || f.Queue != "" || pod.Annotations[migrate.QueueAnnotation] != "":
		return migrate.MS2M
	}
	return migrate.CheckpointRestore
}

// withoutRegistry sends the checkpoint node to node where the
// kubectl-migrate runtime restores it (which needs no image), and then
// uses no registry.
func withoutRegistry(c *migrate.Config) {
	if c.Restore == migrate.RestoreRuntime {
		c.Transfer = migrate.Direct
	}
	if c.Transfer == migrate.Direct {
		c.ImageRepository = ""
	}
}

// podQueue expands $(POD_NAME) in a queue name with the pod's name, so that
// a StatefulSet's template can name each ordinal's own queue.
func podQueue(queue string, pod *corev1.Pod) string {
	if pod == nil {
		return queue
	}
	// A restored copy keeps the queue its process was started with: its
	// first pod's name.
	name := cmp.Or(pod.Annotations[migrate.OriginalNameAnnotation], pod.Name)
	return strings.ReplaceAll(queue, "$(POD_NAME)", name)
}

// run reads the pod, makes the config, migrates and prints the result.
func (f *migrationFlags) run(ctx context.Context, mc migrationCommand) error {
	client, err := f.NewClient()
	if err != nil {
		return err
	}
	cfg, source, record, err := f.migrate(ctx, client, mc)
	if err != nil {
		code := outcomeCode(record)
		if hint := report.RecoverCommand(cfg.Namespace, cfg.ID); code == ExitRecover && !strings.Contains(err.Error(), hint) {
			// Exit 5 says what to run, whatever left the journal.
			err = fmt.Errorf("%w; the journal is kept: %s", err, hint)
		}
		err = withCode(code, err)
	}
	if record == nil {
		return err
	}
	if f.DryRun && err == nil {
		if record.Restore != "" {
			cfg.Restore = migrate.Restore(record.Restore) // as preflight chose
		}
		return f.printPlan(cfg, source, record.Prediction)
	}
	if printErr := f.printRecord(record); printErr != nil && err == nil {
		err = printErr
	}
	return err
}

// migrate reads the pod, makes the config and runs the migration with the
// live status; record is nil when the migration never started.
func (f *migrationFlags) migrate(ctx context.Context, client kubernetes.Interface, mc migrationCommand) (migrate.Config, *corev1.Pod, *report.Record, error) {
	source, err := migrate.GetSourcePod(ctx, client, f.namespace, f.pod, "")
	if err != nil {
		return migrate.Config{}, nil, nil, err
	}
	cfg, err := mc.toConfig(source, rand.String(5))
	if err != nil {
		return cfg, source, nil, err
	}
	if cfg.Broker.URL, err = f.brokerCredentials(ctx, client, cfg.Namespace, brokerSecretOf(f.BrokerSecret, source.Annotations), cfg.Broker.URL); err != nil {
		return cfg, source, nil, err
	}
	deps, err := f.NewDeps(ctx, client, cfg, source.Spec.ImagePullSecrets)
	if err != nil {
		return cfg, source, nil, err
	}
	hint := "the journal is kept; finish or undo the migration with " + migrate.RecoverCommand(cfg.Namespace, cfg.ID)
	f.recoverHint.Store(&hint)
	record, err := migrate.Run(ctx, cfg, deps, newStatus(f.RootOptions).hooks(f.InjectCrash)) // validates cfg
	return cfg, source, record, err
}

func (f *migrationFlags) printRecord(r *report.Record) error {
	return f.RootOptions.printRecord(r, f.Output)
}
