// Package report defines the record of one migration (phases with
// millisecond timings, outcome, downtime and the broker figures seen), stores
// records as labelled ConfigMaps in the cluster so any machine can read them
// (pkg/report/render draws them; this package has no terminal code).
package report

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// Outcome is how a migration ended.
type Outcome string

// Outcomes.
const (
	Succeeded  Outcome = "succeeded"
	RolledBack Outcome = "rolled-back"
	// Failed means the migration failed and was left as it was, because
	// --keep-on-failure was set or the rollback itself failed.
	Failed Outcome = "failed"
	// Committed means the target took over but cleanup did not finish.
	Committed Outcome = "committed"
	// Running means the migration has not ended: it runs, or the process
	// running it died and its journal waits for kubectl migrate recover.
	Running Outcome = "running"
	// Interrupted is how kubectl migrate report shows a migration that did
	// not end and that no process runs any more; it is never saved.
	Interrupted Outcome = "interrupted"
	// NotStarted is a drain's move that it did not get to (it was
	// interrupted, or stopped at a failure with --fail-fast).
	NotStarted Outcome = "not-started"
)

// Prediction is what a migration expects, made as its preflight ends (a
// dry run's is all it does): λ measured on the workload's exchange, μ from
// earlier migrations of its queue or the application's service time, the
// critical path and the other phases from the cluster's recent migrations
// of the same kind (FromRuns of them; none: conservative defaults), and
// from those replay ≈ backlog / (μ − λ), total and downtime. A zero field
// is unknown. A record keeps it beside what happened.
type Prediction struct {
	Lambda             float64  `json:"lambda"`
	LambdaWindowMillis int64    `json:"lambdaWindowMillis"`
	Mu                 float64  `json:"mu,omitempty"`
	MuFrom             string   `json:"muFrom,omitempty"`
	FromRuns           int      `json:"fromRuns"`
	CriticalPathMillis int64    `json:"criticalPathMillis"`
	Backlog            float64  `json:"backlog"`
	ReplayMillis       int64    `json:"replayMillis,omitempty"`
	TotalMillis        int64    `json:"totalMillis,omitempty"`
	DowntimeMillis     int64    `json:"downtimeMillis,omitempty"`
	Warnings           []string `json:"warnings,omitempty"`
	// Freeze is a checkpoint/restore move's: its downtime is the freeze,
	// which grows with the pod's memory (DowntimeMillis is Freeze.Millis).
	Freeze *Freeze `json:"freeze,omitempty"`
}

// Freeze is the freeze a checkpoint/restore move of a pod is expected to
// take: base + memory × rate, with the pod's memory from metrics.k8s.io (its
// working set, as kubectl top shows it) or else its containers' memory
// limits (then an upper bound), and base and rate fitted on the cluster's
// earlier such moves (FromRuns of them; fewer than two of different
// sizes: the lab's measured figures). Millis 0: the memory is unknown.
type Freeze struct {
	Millis      int64  `json:"millis,omitempty"`
	MemoryBytes int64  `json:"memoryBytes,omitempty"`
	MemoryFrom  string `json:"memoryFrom,omitempty"`
	FromRuns    int    `json:"fromRuns"`
}

// AtMost: the memory figure is the pod's limits, not what it uses, so the
// prediction is a bound.
func (f *Freeze) AtMost() bool { return f.MemoryFrom == kube.MemoryFromLimits }

// Summary says the prediction in a phrase: "freeze ≈ 4s for the 321 MiB it
// uses (metrics.k8s.io), at the rate of 3 earlier moves here".
func (f *Freeze) Summary() string {
	if f.Millis <= 0 {
		return "freeze unknown: neither metrics.k8s.io nor a memory limit tells its memory"
	}
	approx, memory := "≈", fmt.Sprintf("the %d MiB it uses (%s)", f.MemoryBytes>>20, f.MemoryFrom)
	if f.AtMost() {
		approx, memory = "≤", fmt.Sprintf("its memory limit of %d MiB (metrics.k8s.io does not tell what it uses)", f.MemoryBytes>>20)
	}
	basis := fmt.Sprintf("the rate of %d earlier moves here", f.FromRuns)
	if f.FromRuns == 0 {
		basis = "the lab's rate (no earlier moves of different sizes here)"
	}
	return fmt.Sprintf("freeze %s %s for %s, at %s", approx, (time.Duration(f.Millis) * time.Millisecond).Round(100*time.Millisecond), memory, basis)
}

// Where a prediction's μ came from.
const (
	MuFromHistory     = "earlier migrations"
	MuFromApplication = "the application's service time"
)

// DrainStrategy is the Strategy of a drain's record.
const DrainStrategy = "drain"

// Drain is what a node drain (kubectl migrate node) did: one move per
// migratable pod, each with its own migration record, and the pods it left.
type Drain struct {
	Moves   []DrainMove `json:"moves"`
	Skipped []DrainSkip `json:"skipped,omitempty"`
	// Evicted are the pods handed to the eviction API (--evict-rest).
	Evicted []string `json:"evicted,omitempty"`
	// Uncordoned: the drain stopped early and gave the node back.
	Uncordoned bool `json:"uncordoned,omitempty"`
}

// Outcome is a drain's: succeeded once every move did, else failed.
func (d *Drain) Outcome() Outcome {
	for _, m := range d.Moves {
		if m.Outcome != Succeeded {
			return Failed
		}
	}
	return Succeeded
}

// DrainMove is one pod's migration within a drain.
type DrainMove struct {
	Namespace   string `json:"namespace"`
	Pod         string `json:"pod"`
	StatefulSet string `json:"statefulSet,omitempty"`
	Target      string `json:"target"`
	// Migration is the pod's migration ID (its own record), once started.
	Migration      string  `json:"migration,omitempty"`
	Outcome        Outcome `json:"outcome"`
	Error          string  `json:"error,omitempty"`
	DowntimeMillis int64   `json:"downtimeMillis,omitempty"`
	TotalMillis    int64   `json:"totalMillis,omitempty"`
}

// DrainSkip is a pod a drain left where it was.
type DrainSkip struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Reason    string `json:"reason"`
}

// RecoverCommand is the command that finishes or undoes migration id.
func RecoverCommand(namespace, id string) string {
	return version.Command() + " recover " + id + " -n " + namespace
}

// Final reports whether the outcome ends the migration for good, with
// nothing left to finish or undo.
func (o Outcome) Final() bool { return o == Succeeded || o == RolledBack }

// PhaseName names a phase.
type PhaseName string

// The phases, in the order MS2M runs them; stop-and-copy runs Stop instead
// of Prepare and Replay.
const (
	Preflight PhaseName = "preflight"
	// Setup readies the lock, the agents and the arrival probe; like
	// preflight, it changes nothing of the workload.
	Setup      PhaseName = "setup"
	Prepare    PhaseName = "prepare"
	Stop       PhaseName = "stop"
	Checkpoint PhaseName = "checkpoint"
	Image      PhaseName = "image"
	Restore    PhaseName = "restore"
	Replay     PhaseName = "replay"
	Switchover PhaseName = "switchover"
	// Detach and Adopt are a StatefulSet pod's: the source and the
	// StatefulSet go away before the copy exists, and come back adopting it.
	Detach  PhaseName = "detach"
	Adopt   PhaseName = "adopt"
	Cleanup PhaseName = "cleanup"
)

// PhaseTiming is the timing of one phase (migrate.Phase is the phase itself).
type PhaseTiming struct {
	Name PhaseName `json:"name"`
	// Stage tells repeated phases apart: a StatefulSet pod's shadow mode
	// runs them once into the shadow and once into the final pod.
	Stage string `json:"stage,omitempty"`
	// StartMillis is the offset from the migration's start.
	StartMillis    int64  `json:"startMillis"`
	DurationMillis int64  `json:"durationMillis"`
	Error          string `json:"error,omitempty"`
	RolledBack     bool   `json:"rolledBack,omitempty"`
	// Running is set while the phase runs: a record saved by a process that
	// died keeps it on the phase it died in.
	Running bool `json:"running,omitempty"`
	// Steps time the parts of the phase that matter for where the time
	// went, the runtime's work apart from the plugin's own.
	Steps []Step `json:"steps,omitempty"`
}

// Step is a timed part of a phase.
type Step struct {
	Name StepName `json:"name"`
	// Container names the container a per-container step was for.
	Container string `json:"container,omitempty"`
	// StartMillis is the offset from the migration's start.
	StartMillis    int64 `json:"startMillis"`
	DurationMillis int64 `json:"durationMillis"`
	// Bytes is what the step moved, where it moved data.
	Bytes int64 `json:"bytes,omitempty"`
}

// StepName names a step.
type StepName string

// The steps the phases time.
const (
	// AgentsReady is preflight starting the agents on both nodes.
	AgentsReady StepName = "agents ready"
	// BasePull is the target pulling the base images its restore needs.
	BasePull StepName = "base pull"
	// CheckpointCall is the kubelet's checkpoint (the runtime's CRIU dump).
	CheckpointCall StepName = "checkpoint call"
	// VolumeSnapshot copies the emptyDir volumes' files on the source node.
	VolumeSnapshot StepName = "volume snapshot"
	// Pack builds the checkpoint image from the archive.
	Pack StepName = "pack"
	// Push uploads it to the registry, or to the target node's agent.
	Push StepName = "push"
	// PodCreate is the API call that creates the restored pod.
	PodCreate StepName = "pod create"
	// PodAddressed is, for a pod created before its checkpoint existed, its
	// create to the kubelet reporting its address.
	PodAddressed StepName = "pod addressed"
	// PodRunning is the restored pod created → running: sandbox, image
	// pull and the runtime's CRIU restore.
	PodRunning StepName = "created → running"
	// StagedRunning is, for a pod created before its checkpoint existed
	// (the kubectl-migrate runtime's path), staged → running: the
	// runtime's CRIU restore and the application answering.
	StagedRunning StepName = "staged → running"
	// AppHolding is the restored application answering and holding.
	AppHolding StepName = "application holding"
	// LastPage is, with lazy pages, the copy running to the last of its
	// pages arriving from the frozen source: the migration's commit waits
	// for it, the application does not.
	LastPage StepName = "last page arrived"
)

// runtimeSteps are the runtime's own work on the critical path.
var runtimeSteps = []StepName{CheckpointCall, PodRunning, StagedRunning}

// Label names the phase with its stage, if any.
func (p PhaseTiming) Label() string {
	if p.Stage == "" {
		return string(p.Name)
	}
	return string(p.Name) + " · " + p.Stage
}

// Record is everything kept about one migration.
type Record struct {
	ID       string `json:"id"`
	Strategy string `json:"strategy"`
	// Mode is a StatefulSet pod's: sequential or shadow.
	Mode       string        `json:"mode,omitempty"`
	Namespace  string        `json:"namespace"`
	Pod        string        `json:"pod"`
	TargetPod  string        `json:"targetPod,omitempty"`
	SourceNode string        `json:"sourceNode"`
	TargetNode string        `json:"targetNode"`
	StartedAt  time.Time     `json:"startedAt"`
	Outcome    Outcome       `json:"outcome"`
	Error      string        `json:"error,omitempty"`
	Phases     []PhaseTiming `json:"phases"`
	// TotalMillis is migration start to target restored and synchronised
	// (the end of the switchover); 0 when it did not get there.
	TotalMillis int64 `json:"totalMillis"`
	// Downtime is measured from the instances' own per-message timestamps.
	Downtime *Downtime `json:"downtime,omitempty"`
	Broker   Broker    `json:"broker"`
	Cutoff   *Cutoff   `json:"cutoff,omitempty"`
	Shadow   *Shadow   `json:"shadow,omitempty"`
	Images   []string  `json:"images,omitempty"`
	// Restore is how the target restored: "cri" (its container runtime,
	// from a checkpoint image) or "runtime" (the kubectl-migrate runtime,
	// from the checkpoint staged on the node).
	Restore string `json:"restore,omitempty"`
	// ArchiveBytes is the total size of the checkpoint archives.
	ArchiveBytes int64 `json:"archiveBytes,omitempty"`
	// Leftovers are what a rollback could not remove although nothing
	// depends on it any more (e.g. a checkpoint image in a registry that was
	// down): the source serves, and these wait to be removed by hand.
	Leftovers []string `json:"leftovers,omitempty"`
	// Labels tag a run for comparisons across runs (e.g. rate=10).
	Labels map[string]string `json:"labels,omitempty"`
	// Prediction is what the migration expected as its preflight ended.
	Prediction *Prediction `json:"prediction,omitempty"`
	// Drain is set on a node drain's record (Strategy DrainStrategy, Pod
	// the node).
	Drain *Drain `json:"drain,omitempty"`
	// Journal is the engine's state, kept while the migration may need
	// finishing or undoing (pkg/migrate reads and writes it).
	Journal json.RawMessage `json:"-"`
	// JournalMAC authenticates Journal (pkg/migrate signs and checks it).
	JournalMAC string `json:"-"`
	// ResourceVersion is the stored record's version as last read or
	// written: a save over a record someone else changed since fails.
	ResourceVersion string `json:"-"`
}

// Downtime is the span in which no instance applied messages although one
// was waiting: from the source's last applied message (or the arrival of the
// next one, if later) to the target applying that next message.
type Downtime struct {
	Millis              int64     `json:"millis"`
	SourceLastSeq       uint64    `json:"sourceLastSeq"`
	SourceLastAppliedAt time.Time `json:"sourceLastAppliedAt"`
	NextSeq             uint64    `json:"nextSeq"`
	NextSentAt          time.Time `json:"nextSentAt"`
	NextAppliedAt       time.Time `json:"nextAppliedAt"`
}

// Cutoff records the threshold-based cutoff: its inputs, T_cutoff, whether
// it fired and the replay time actually spent.
type Cutoff struct {
	// ReplayMaxMillis is T_replay_max; 0 with a fixed cutoff.
	ReplayMaxMillis int64 `json:"replayMaxMillis,omitempty"`
	// FixedMillis is a cutoff given by the user instead.
	FixedMillis int64 `json:"fixedMillis,omitempty"`
	// ArrivalRate (λ) and ServiceRate (μ, the target's) in messages per
	// second, as last estimated.
	ArrivalRate float64 `json:"arrivalRate,omitempty"`
	ServiceRate float64 `json:"serviceRate,omitempty"`
	// CutoffMillis is T_cutoff after the replay queue's bind.
	CutoffMillis int64 `json:"cutoffMillis,omitempty"`
	Fired        bool  `json:"fired"`
	// FiredAfterMillis is when it fired, after the bind.
	FiredAfterMillis int64  `json:"firedAfterMillis,omitempty"`
	Reason           string `json:"reason,omitempty"`
	// ReplayMillis is the replay actually spent: from the start of replay
	// to the target taking over the primary queue.
	ReplayMillis int64 `json:"replayMillis"`
}

// Shadow records a StatefulSet pod's shadow-mode move: the shadow copy and
// the processing gap at each of its two switchovers, measured like Downtime
// (whose Millis is their sum).
type Shadow struct {
	Pod string `json:"pod"`
	// ToShadowMillis is the gap as the source handed over to the shadow.
	ToShadowMillis int64 `json:"toShadowMillis"`
	// ToFinalMillis is the gap as the shadow handed over to the final pod.
	ToFinalMillis int64 `json:"toFinalMillis"`
}

// Broker holds what the migration saw of the message flow.
type Broker struct {
	ReplayQueue string `json:"replayQueue,omitempty"`
	// ArrivalRate is λ in messages per second, measured on the replay queue
	// while nothing consumed it.
	ArrivalRate float64 `json:"arrivalRate,omitempty"`
	// ReplayBacklog is the replay queue's depth when replay started.
	ReplayBacklog int `json:"replayBacklog,omitempty"`
	// Replayed is how many messages the target applied during replay.
	Replayed uint64 `json:"replayed,omitempty"`
	// PrimaryDepthAtSwitch is the primary queue's depth when the target
	// took it over.
	PrimaryDepthAtSwitch int `json:"primaryDepthAtSwitch,omitempty"`
}

// Phase returns the named phase's timing, if it ran.
func (r *Record) Phase(name PhaseName) (PhaseTiming, bool) {
	for _, p := range r.Phases {
		if p.Name == name {
			return p, true
		}
	}
	return PhaseTiming{}, false
}

// ChangedNothing reports whether the migration ended before it changed
// anything of the workload: in preflight or setup, which only check and
// ready the machinery (a refusal).
func (r *Record) ChangedNothing() bool {
	for _, p := range r.Phases {
		if p.Name != Preflight && p.Name != Setup {
			return false
		}
	}
	return true
}

// ReplayRate is μ as the replay measured it: messages replayed per second
// of replay (0 where nothing was replayed).
func (r *Record) ReplayRate() float64 {
	ph, ok := r.Phase(Replay)
	if !ok || ph.DurationMillis <= 0 || r.Broker.Replayed == 0 {
		return 0
	}
	return float64(r.Broker.Replayed) / (float64(ph.DurationMillis) / 1000)
}

// CriticalPathMillis is the first checkpoint's start to the first restored
// copy holding: what replay's backlog, and stop-and-copy's downtime, grow
// with. 0 if the migration did not get there.
func (r *Record) CriticalPathMillis() int64 {
	cp, ok := r.Phase(Checkpoint)
	rs, ok2 := r.Phase(Restore)
	if !ok || !ok2 || rs.Error != "" || rs.Running {
		return 0
	}
	return rs.StartMillis + rs.DurationMillis - cp.StartMillis
}

// OverheadMillis is the critical path less the runtime's own work on it
// (the checkpoint call, the restored pod's created → running): the time
// the plugin itself adds.
func (r *Record) OverheadMillis() int64 {
	path := r.CriticalPathMillis()
	if path == 0 {
		return 0
	}
	cp, _ := r.Phase(Checkpoint)
	rs, _ := r.Phase(Restore)
	end := rs.StartMillis + rs.DurationMillis
	for _, p := range r.Phases {
		if p.StartMillis < cp.StartMillis || p.StartMillis >= end {
			continue
		}
		for _, s := range p.Steps {
			if slices.Contains(runtimeSteps, s.Name) {
				path -= s.DurationMillis
			}
		}
	}
	return max(0, path)
}

// ElapsedMillis is the time all recorded phases took, end to end.
func (r *Record) ElapsedMillis() int64 {
	var end int64
	for _, p := range r.Phases {
		end = max(end, p.StartMillis+p.DurationMillis)
	}
	return end
}
