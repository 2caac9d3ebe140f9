package migrate

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// State is everything the phases learn and change. It is the migration's
// journal: saved with the record before each step that changes the cluster,
// so that another process can finish or undo the migration from it alone.
type State struct {
	// Stage tells this stage's markers, images and agent pods apart from
	// the other stages' of the same migration.
	Stage string `json:"stage,omitempty"`

	// Set by preflight.
	Source      *corev1.Pod    `json:"source,omitempty"`
	SourceNode  string         `json:"sourceNode,omitempty"`
	Migrated    []string       `json:"migrated,omitempty"` // the containers migrated
	SourceState protocol.State `json:"sourceState"`
	// RestoreVia is how the target restores, as preflight chose it
	// (RestoreCRI or RestoreRuntime); a StatefulSet pod's restores on its
	// source node (rollback, move back) go the same way.
	RestoreVia Restore `json:"restoreVia,omitempty"`

	// MigrationQueue exists while the migration runs (protocol.MigrationQueueName):
	// a copy restored from a checkpoint holds only as long as it does.
	MigrationQueue string    `json:"migrationQueue,omitempty"`
	ReplayQueue    string    `json:"replayQueue,omitempty"`
	ReplayBound    time.Time `json:"replayBound,omitzero"`
	ReplayStarted  time.Time `json:"replayStarted,omitzero"`
	// Archives maps each container to its checkpoint archive on the source
	// node, for as long as the archive is there; a container whose
	// checkpoint was asked for but not answered maps to the pattern of its
	// archives.
	Archives map[string]string `json:"archives,omitempty"`
	// Images maps each container to its pushed checkpoint image, or with
	// RestoreRuntime to the checkpoint staged on the target node
	// (agent.StagedPath).
	Images map[string]string `json:"images,omitempty"`
	// TargetRequested is set before the target pod is created, so a journal
	// saved by a process that died during the create still names it.
	TargetRequested bool        `json:"targetRequested,omitempty"`
	Target          *corev1.Pod `json:"target,omitempty"`
	// TargetRestored is the state the restored copy held with: its
	// checkpoint's. A copy whose state moved past it applied messages.
	TargetRestored protocol.State `json:"targetRestored"`
	// SourceFinal is the source's state when it stopped.
	SourceFinal  protocol.State `json:"sourceFinal"`
	SourceHalted bool           `json:"sourceHalted,omitempty"`
	// SourcePaused: a live source (MS2M) is stopped while its checkpoint
	// and its emptyDir volumes are taken, so files and memory are of one
	// moment; set before the stop, cleared once it consumes again.
	SourcePaused bool `json:"sourcePaused,omitempty"`
	// SourceFrozen: a lazy checkpoint left the source frozen, serving its
	// pages, until its page session ends (set once the checkpoint returns,
	// cleared once the session ended): it answers nothing until then.
	SourceFrozen bool `json:"sourceFrozen,omitempty"`
	// SourceIsolated: a source without the MS2M contract
	// (CheckpointRestore) is cut off the network before its checkpoint, at
	// IsolatedAt (agent.Launcher.Fence); set before the cut, cleared once
	// the cut is lifted.
	SourceIsolated bool      `json:"sourceIsolated,omitempty"`
	IsolatedAt     time.Time `json:"isolatedAt,omitzero"`
	// Committed is set before the target is told to take the primary
	// queue: from then on the migration completes forward and never rolls
	// back.
	Committed bool `json:"committed,omitempty"`
	AgentPods int  `json:"agentPods,omitempty"`

	// ReplicaSet is the source's controller, for a ReplicaSet's (a
	// Deployment's) pod, and HiddenLabels the labels its copy goes without
	// until it takes the source's place (see replicaset.go).
	ReplicaSet   string   `json:"replicaSet,omitempty"`
	HiddenLabels []string `json:"hiddenLabels,omitempty"`

	// StatefulSet migrations: the spec is saved before the StatefulSet is
	// deleted.
	SavedSTS      *appsv1.StatefulSet `json:"savedStatefulSet,omitempty"`
	STSDeleted    bool                `json:"statefulSetDeleted,omitempty"`
	SourceDeleted bool                `json:"sourceDeleted,omitempty"`

	// Shadow mode: whether the shadow has taken over from the source, and
	// the final stage, which moves the shadow into the StatefulSet's name.
	HandedOver bool   `json:"handedOver,omitempty"`
	Final      *State `json:"final,omitempty"`
}

// Migration is one migration's configuration, outside systems and State,
// shared by its phases. A stage of a shadow-mode migration is a Migration of
// its own whose State is part of its parent's.
type Migration struct {
	// config is what was asked for; deps are the outside systems; hooks
	// report progress; state is what the phases learn and change, saved in
	// the journal.
	config Config
	deps   Deps
	hooks  Hooks
	state  *State

	// journal saves the State with the record; all stages share it.
	journal *journal
	broker  Broker
	// probe counts arrivals during preflight, for the prediction.
	probe *lambdaProbe
	// leases are the migration's locks on its pod and StatefulSet, and
	// fence ends its work on the cluster if it loses them; all stages share
	// the fence.
	leases *lease.Set
	fence  *fence
	// receivers are the nodes' agents a transfer without a registry sends
	// to (direct.go); all stages share them.
	receivers *receivers
	// warm are the nodes where this process started a warm agent, which
	// packs, sends and snapshots there; all stages share them.
	warm *nodeSet
	// nodes are the source and target Nodes as preflight read them.
	nodes struct{ source, target *corev1.Node }
	// shadow is a shadow-mode migration's own: its final stage (whose
	// State is State.Final), which moves the shadow into the StatefulSet's
	// name, and the first switchover's gap, read from the shadow while it
	// served.
	shadow struct {
		final *Migration
		gap   *report.Downtime
	}
	// phase is the index in Record.Phases of the phase running.
	phase int
	// events tells the source and target pods' Events what happens to
	// them (none in a dry run); all stages share it.
	events *kube.PodEvents

	Record *report.Record
}

// sourceApp addresses the source instance.
func (m *Migration) sourceApp() appctl.Target { return m.app(m.config.Pod) }

// app addresses the instance in pod.
func (m *Migration) app(pod string) appctl.Target {
	return appctl.Target{Namespace: m.config.Namespace, Pod: pod, Port: m.config.ControlPort, Token: m.config.ControlToken}
}

// waitPrimary waits until the instance t consumes its primary queue.
func (m *Migration) waitPrimary(ctx context.Context, t appctl.Target) error {
	return wait.PollUntilContextCancel(ctx, appPollInterval, true, func(ctx context.Context) (bool, error) {
		st, err := m.deps.App.State(ctx, t)
		return err == nil && st.Mode == protocol.ModePrimary, nil
	})
}

// targetApp addresses the restored instance.
func (m *Migration) targetApp() appctl.Target { return m.app(m.config.TargetName) }

func (m *Migration) progress(phase report.PhaseName, msg string) {
	if m.hooks.Progress != nil {
		m.hooks.Progress(phase, msg)
	}
}

// step records a timed part of the running phase, from start to now.
func (m *Migration) step(name report.StepName, container string, start time.Time, bytes int64) {
	m.stepTook(name, container, start, time.Since(start), bytes)
}

// stepTook records a timed part of the running phase that took took from
// start (a duration the agent measured).
func (m *Migration) stepTook(name report.StepName, container string, start time.Time, took time.Duration, bytes int64) {
	if m.phase >= len(m.Record.Phases) {
		return
	}
	p := &m.Record.Phases[m.phase]
	p.Steps = append(p.Steps, report.Step{
		Name: name, Container: container, Bytes: bytes,
		StartMillis: start.Sub(m.Record.StartedAt).Milliseconds(), DurationMillis: took.Milliseconds(),
	})
}

// tag identifies this stage of the migration.
func (m *Migration) tag() string {
	if m.state.Stage == "" {
		return m.config.ID
	}
	return m.config.ID + "-" + m.state.Stage
}

// nextAgentPod names the next agent pod of this stage.
func (m *Migration) nextAgentPod() string {
	m.state.AgentPods++
	return "kubectl-migrate-agent-" + m.tag() + "-" + string(rune('a'+m.state.AgentPods-1))
}

// nextStage is a migration from the pod this one restored (or from the
// source, for a stage that returns it) into name on node; it shares the
// broker, the record, the journal and what preflight learnt about the
// source. A stage with state is resumed from it (recovery).
func (m *Migration) nextStage(stage string, from *corev1.Pod, name, node string, strategy Strategy, state *State) *Migration {
	cfg := m.config
	cfg.Pod, cfg.TargetName, cfg.TargetNode, cfg.Strategy = from.Name, name, node, strategy
	if state == nil {
		state = &State{Stage: stage, Source: from, SourceNode: from.Spec.NodeName, Migrated: m.state.Migrated, SourceState: m.state.SourceState, RestoreVia: m.state.RestoreVia}
	}
	return &Migration{
		config: cfg, deps: m.deps, hooks: m.hooks, Record: m.Record, state: state,
		journal: m.journal, broker: m.broker, fence: m.fence, receivers: m.receivers, warm: m.warm, events: m.events,
	}
}

// journaled sets *flag to value and saves the journal before the step the
// flag announces, so a process that dies during the step leaves a journal
// that names it; a save that fails takes the flag back, as the step never
// began.
func (m *Migration) journaled(ctx context.Context, flag *bool, value bool) error {
	old := *flag
	*flag = value
	if err := m.save(ctx); err != nil {
		*flag = old
		return err
	}
	return nil
}

// save writes the journal; every step that changes the cluster calls it
// first, so a process that dies leaves a journal naming what it changed.
func (m *Migration) save(ctx context.Context) error {
	if m.journal == nil {
		return nil
	}
	if err := m.fence.broken(); err != nil {
		return err // the journal is its recovery's now
	}
	return m.journal.save(ctx)
}

// markRunning declares the queue whose existence tells restored copies that
// their migration runs; the first phase that changes anything calls it.
func (m *Migration) markRunning(ctx context.Context) error {
	m.state.MigrationQueue = protocol.MigrationQueueName(m.config.Broker.Queue)
	if err := m.save(ctx); err != nil {
		return err
	}
	return m.broker.DeclareQueue(ctx, m.state.MigrationQueue)
}

// fence ends a migration's work on the cluster once it can no longer be
// sure it holds its lock: every context the migration changes the cluster
// with, its rollback's too, ends with lease.ErrLost, and its journal is no
// longer written.
type fence struct {
	ctx context.Context
	cut context.CancelCauseFunc
}

func newFence() *fence {
	ctx, cut := context.WithCancelCause(context.Background())
	return &fence{ctx: ctx, cut: cut}
}

// lose breaks the fence with err.
func (f *fence) lose(err error) {
	if f != nil {
		f.cut(err)
	}
}

// broken returns why the fence broke, or nil.
func (f *fence) broken() error {
	if f == nil || f.ctx.Err() == nil {
		return nil
	}
	return context.Cause(f.ctx)
}

// bind returns ctx, also ended when the fence breaks.
func (f *fence) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	if f == nil {
		return ctx, func() {}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(f.ctx, func() { cancel(context.Cause(f.ctx)) })
	return ctx, func() { stop(); cancel(nil) }
}
