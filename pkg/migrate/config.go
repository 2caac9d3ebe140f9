// Package migrate is the migration engine: an ordered list of phases behind
// one interface that share one Migration, each timed at millisecond
// precision and reported through Hooks, with a rollback for every phase so
// a failure or an interrupt leaves the source serving. It parses no flags:
// the plugin builds a Config and the dependencies and calls Run (its
// errors do name the plugin's flags where one is the fix: the plugin is its
// one caller).
package migrate

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// Strategy selects the phase list.
type Strategy string

// Strategies.
const (
	// MS2M checkpoints the running source, restores it on the target and
	// replays the messages buffered meanwhile, so the source serves until
	// the switchover.
	MS2M Strategy = "ms2m"
	// StopAndCopy stops the source first, then checkpoints, transfers and
	// restores it: the baseline, whose downtime is about its migration time.
	StopAndCopy Strategy = "stop-and-copy"
	// CheckpointRestore moves a pod that does not follow the MS2M
	// contract, whatever its process: the source is cut off the network
	// (a fence in its network namespace, so that nothing it does after its
	// checkpoint reaches anyone), checkpointed, restored on the target, and
	// the copy takes its place. No broker; the downtime is the whole move,
	// and clients' connections are reset.
	CheckpointRestore Strategy = "checkpoint-restore"
)

// Pages is how a checkpoint carries the process's memory.
type Pages string

// The ways of the pages.
const (
	// PagesEager puts the whole memory into the checkpoint: the freeze
	// grows with it.
	PagesEager Pages = "eager"
	// PagesLazy leaves the pages in the frozen source while the copy runs
	// on the target, which faults them in as it touches them while the
	// rest follow over the agents' stream (CRIU's lazy pages, through the
	// kubectl-migrate runtime on both nodes; stop-and-copy only). The
	// source resumes once the last page arrived, and the migration commits
	// only then.
	PagesLazy Pages = "lazy"
)

// PagesWays lists the valid ways of the pages.
var PagesWays = []Pages{PagesEager, PagesLazy}

// Strategies lists the valid strategies.
var Strategies = []Strategy{MS2M, StopAndCopy, CheckpointRestore}

// Contract reports whether s drives the application through the MS2M
// contract (its control endpoint and its queues), which CheckpointRestore
// does not need.
func (s Strategy) Contract() bool { return s != CheckpointRestore }

// StatefulSetMode is how a StatefulSet pod moves (protocol.Mode is what an application instance is doing).
type StatefulSetMode string

// Modes.
const (
	// Sequential is the paper's: the source goes away before its restored
	// copy exists under the same name, so downtime spans the restore.
	Sequential StatefulSetMode = "sequential"
	// Shadow restores a differently named shadow copy on the target while
	// the source serves, hands the queue to it, then moves the shadow into
	// the StatefulSet's name on the same node the same way: two switchovers,
	// each a gap of milliseconds.
	Shadow StatefulSetMode = "shadow"
)

// Modes lists the valid StatefulSet modes.
var Modes = []StatefulSetMode{Sequential, Shadow}

// ShadowName names the shadow copy of a StatefulSet pod. It does not end in
// -ORDINAL, so the StatefulSet controller never takes it for a member.
func ShadowName(pod string) string { return pod + "-shadow" }

// Transfer is how a checkpoint gets from the source node to the target.
type Transfer string

// Transfers.
const (
	// ViaRegistry pushes checkpoint images to a registry both nodes reach.
	ViaRegistry Transfer = "registry"
	// Direct streams the checkpoint from the source node's agent to the
	// target node's, which serves it to its own runtime: no registry, and
	// the checkpoint never leaves the two nodes.
	Direct Transfer = "direct"
)

// Transfers lists the valid transfers.
var Transfers = []Transfer{ViaRegistry, Direct}

// Restore is how the target node restores a checkpoint.
type Restore string

// Restores.
const (
	// RestoreAuto is RestoreRuntime where the kubectl-migrate runtime is
	// installed (kubectl migrate node-setup; on both nodes for a
	// StatefulSet pod), otherwise RestoreCRI where the target node's
	// container runtime restores.
	RestoreAuto Restore = "auto"
	// RestoreCRI has the container runtime restore from a checkpoint image
	// (CRI-O; containerd 2.1–2.3).
	RestoreCRI Restore = "cri"
	// RestoreRuntime has the kubectl-migrate runtime (RuntimeClass
	// kubectl-migrate) restore the target container from the checkpoint
	// its agent staged on the node: no image anywhere, and the checkpoint
	// goes node to node (the direct transfer). For runtimes without CRI
	// restore, such as containerd 2.4.
	RestoreRuntime Restore = "runtime"
)

// Restores lists the valid restores.
var Restores = []Restore{RestoreAuto, RestoreCRI, RestoreRuntime}

// BrokerConfig locates the workload's queues.
type BrokerConfig struct {
	URL      string
	Exchange string
	Queue    string
}

// Config is one migration's plain configuration.
type Config struct {
	ID        string
	Strategy  Strategy
	Namespace string
	Pod       string
	// Containers to migrate; empty means all of the pod's containers.
	Containers []string
	TargetNode string
	// TargetName is the restored pod's name.
	TargetName string
	// StatefulSet names the pod's StatefulSet: the pod keeps its name,
	// ordinal and labels, moving in Mode.
	StatefulSet string
	Mode        StatefulSetMode

	Transfer Transfer
	Restore  Restore // "" is RestoreAuto
	// Pages is how the checkpoint carries the memory ("" is PagesEager).
	Pages            Pages
	ImageRepository  string // where checkpoint images are pushed (ViaRegistry)
	RegistrySecret   string // dockerconfigjson secret for push and pull
	InsecureRegistry bool
	AgentImage       string
	// AgentNamespace is where the agents run (agent.DefaultNamespace).
	AgentNamespace string
	// AllowAnonymousCheckpoints lets a checkpoint image go to a registry,
	// and be restored by the container runtime, with no pull secret: the
	// target node's kubelet then lets any pod run it, and anyone who
	// reaches the registry may read it. Refused without.
	AllowAnonymousCheckpoints bool
	// KeepImages keeps the checkpoint images in the registry after success;
	// they are deleted (manifest and blobs) by default: they hold the
	// process's memory.
	KeepImages bool
	// MaxVolumeBytes bounds the emptyDir data a migration carries
	// (0: DefaultMaxVolumeBytes).
	MaxVolumeBytes int64

	Broker      BrokerConfig
	ControlPort int
	// ControlToken is the namespace's control token (protocol.ControlSecret),
	// read in preflight and by a recovery: never journaled.
	ControlToken string `json:"-"`

	CheckpointTimeout time.Duration
	PhaseTimeout      time.Duration
	ReplayTimeout     time.Duration
	// KubeletTimeout is how long a node's kubelet may not answer before the
	// migration stops waiting for it (0: 15 s): a target pod it never
	// starts fails the restore, one it never confirms deleted is stopped
	// through the node's runtime instead.
	KubeletTimeout time.Duration
	// ReplayMax turns on the threshold cutoff: replay is kept within it by
	// stopping the source T_cutoff = ReplayMax·μ/λ after the replay queue's
	// bind, with λ and μ measured during the migration.
	ReplayMax time.Duration
	// Cutoff stops the source this long after the bind, whatever the rates.
	Cutoff time.Duration
	// PredictWindow is how long, at least, a migration counts arrivals for
	// its prediction (0: one second; negative: it predicts nothing).
	PredictWindow time.Duration
	// Timeout bounds the whole migration; rollback gets its own time.
	Timeout time.Duration
	// KeepOnFailure leaves everything as it is when a migration fails.
	KeepOnFailure bool
	// DryRun runs preflight and setup, predicts, and undoes the setup.
	DryRun bool
	// ReadOnly, with DryRun, runs preflight alone: it only reads the
	// cluster (kubectl's --dry-run=client), starting no agent and binding
	// no probe, so it predicts nothing.
	ReadOnly bool
	// Labels are copied into the record, for comparing runs.
	Labels map[string]string
	// InjectFailure makes the named phase ("replay", or "replay/final" for
	// one stage's) fail once it has done its work, to prove rollback on a
	// real cluster.
	InjectFailure string
}

// Agents is the namespace the agents run in.
func (c Config) Agents() string {
	return cmp.Or(c.AgentNamespace, agent.DefaultNamespace)
}

// Validate checks what can be checked without the cluster.
func (c Config) Validate() error {
	errs := []error{c.ValidateChoices()}
	if c.Pod == "" {
		errs = append(errs, errors.New("a pod name is required"))
	}
	if c.Transfer != Direct && c.ImageRepository == "" {
		errs = append(errs, errors.New("--registry is required (or the ms2m.io/registry annotation): where checkpoint images are pushed; or pass --transfer direct"))
	}
	if c.Strategy.Contract() && (c.Broker.URL == "" || c.Broker.Exchange == "" || c.Broker.Queue == "") {
		errs = append(errs, errors.New("broker URL, exchange and queue are required for --strategy "+string(c.Strategy)+": set --broker-url/--exchange/--queue or the ms2m.io/* annotations on the pod; a pod that does not follow the MS2M contract moves with --strategy "+string(CheckpointRestore)+", which needs none"))
	}
	if c.StatefulSet != "" {
		if c.TargetName != c.Pod {
			errs = append(errs, errors.New("a StatefulSet pod keeps its name"))
		}
	} else if bad := validation.IsDNS1123Subdomain(c.TargetName); len(bad) > 0 {
		errs = append(errs, fmt.Errorf("--target-name %q is not a valid pod name (%s); use lower-case letters, digits and '-'", c.TargetName, strings.Join(bad, "; ")))
	} else if c.TargetName == c.Pod {
		errs = append(errs, fmt.Errorf("--target-name %s is the source's own name; the restored pod needs another", c.TargetName))
	}
	return errors.Join(errs...)
}

// ValidateChoices checks what the flags alone decide (the choices, their
// combinations, the limits), so the CLI refuses bad input before it talks
// to the cluster, by the same rules the engine applies.
func (c Config) ValidateChoices() error {
	var errs []error
	if c.TargetNode == "" {
		errs = append(errs, fmt.Errorf("--to NODE is required: the node to move pod %s to", c.Pod))
	}
	if !slices.Contains(Strategies, c.Strategy) {
		errs = append(errs, fmt.Errorf("--strategy must be one of %v, not %q", Strategies, c.Strategy))
	}
	if c.Transfer != "" && !slices.Contains(Transfers, c.Transfer) {
		errs = append(errs, fmt.Errorf("--transfer must be one of %v, not %q", Transfers, c.Transfer))
	}
	if c.Restore != "" && !slices.Contains(Restores, c.Restore) {
		errs = append(errs, fmt.Errorf("--restore must be one of %v, not %q", Restores, c.Restore))
	}
	if c.Pages != "" && !slices.Contains(PagesWays, c.Pages) {
		errs = append(errs, fmt.Errorf("--pages must be one of %v, not %q", PagesWays, c.Pages))
	}
	if c.Pages == PagesLazy {
		errs = append(errs, c.lazyPagesChoices()...)
	}
	if c.Transfer == Direct && c.StatefulSet != "" && c.Restore != RestoreRuntime {
		errs = append(errs, errors.New("a StatefulSet pod's checkpoint goes without a registry only with --restore runtime: its rollback restores the source from the checkpoint image, which must then be pullable on the source node too; use a registry"))
	}
	if c.ControlPort <= 0 || c.ControlPort > 65535 {
		errs = append(errs, fmt.Errorf("--control-port %d is not a port", c.ControlPort))
	}
	for _, d := range []struct {
		flag string
		d    time.Duration
	}{{"--timeout", c.Timeout}, {"--replay-timeout", c.ReplayTimeout}, {"--phase-timeout", c.PhaseTimeout}} {
		if d.d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive", d.flag))
		}
	}
	if c.KubeletTimeout < 0 {
		errs = append(errs, errors.New("--kubelet-timeout must not be negative"))
	}
	if c.ReplayMax < 0 || c.Cutoff < 0 {
		errs = append(errs, errors.New("--replay-max and --cutoff must not be negative"))
	}
	if c.ReplayMax > 0 && c.Cutoff > 0 {
		errs = append(errs, errors.New("give --replay-max (cutoff from measured rates) or --cutoff (a fixed one), not both"))
	}
	if (c.ReplayMax > 0 || c.Cutoff > 0) && c.Strategy != MS2M {
		errs = append(errs, errors.New("--replay-max and --cutoff only apply to --strategy ms2m, which replays"))
	}
	if c.StatefulSet == "" {
		if c.Mode != "" {
			errs = append(errs, errors.New("--mode applies to StatefulSet pods: use "+version.Command()+" sts"))
		}
		return errors.Join(errs...)
	}
	if c.ReplayMax > 0 || c.Cutoff > 0 {
		errs = append(errs, errors.New("--replay-max and --cutoff apply to "+version.Command()+" pod: a StatefulSet pod's source stops before its final copy exists"))
	}
	switch c.Mode {
	case Sequential:
	case Shadow:
		if c.Strategy != MS2M {
			errs = append(errs, errors.New("--mode shadow replays into a live shadow copy; it needs --strategy ms2m"))
		}
	default:
		errs = append(errs, fmt.Errorf("--mode must be one of %v, not %q", Modes, c.Mode))
	}
	return errors.Join(errs...)
}

// lazyPagesChoices refuses what lazy pages cannot go with: they go between
// the agents to the kubectl-migrate runtime, and need the source until the
// last page arrived.
func (c Config) lazyPagesChoices() []error {
	var errs []error
	if c.Strategy == CheckpointRestore {
		// Nothing holds its copy back once it runs but its hidden labels,
		// and a source frozen until the last page would gain nothing.
		errs = append(errs, errors.New("--pages lazy moves --strategy ms2m and stop-and-copy pods: a "+string(CheckpointRestore)+" copy's clients reach it only at the commit, which waits for its last page, so lazy pages would not shorten its freeze"))
	}
	if c.Restore == RestoreCRI {
		errs = append(errs, errors.New("--pages lazy restores through the kubectl-migrate runtime, not --restore cri: the container runtimes' restore takes the whole memory"))
	}
	if c.StatefulSet != "" {
		errs = append(errs, errors.New("--pages lazy needs the source until the copy has its last page, and a StatefulSet pod's source goes before its copy runs under its name"))
	}
	return errs
}
