package migrate

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Migration is the state the phases share.
type Migration struct {
	Config
	Deps
	Hooks Hooks

	// Set by preflight.
	Source     *corev1.Pod
	SourceNode string
	targetNode *corev1.Node
	Containers []string
	broker     Broker
	// SourceState is the source's state as preflight saw it.
	SourceState ms2m.State

	// Set by later phases.
	ReplayQueue   string
	replayBound   time.Time
	replayStarted time.Time
	Archives      map[string]string // container → archive path on the source node
	Images        map[string]string // container → pushed digest reference
	Target        *corev1.Pod
	SourceFinal   ms2m.State // the source's state when it stopped
	sourceHalted  bool
	// committed is set once the target owns the primary queue: from then on
	// the migration completes forward and never rolls back.
	committed bool
	agentPods int
	// StatefulSet migrations.
	savedSTS      *appsv1.StatefulSet
	stsDeleted    bool
	sourceDeleted bool
	// Shadow mode: the stage that moves the shadow into the final pod, and
	// whether the shadow has taken over from the source.
	final      *Migration
	handedOver bool
	// stage tells this stage's markers, images and agent pods apart from
	// the other stages' of the same migration.
	stage string

	Record *report.Record
}

// sourceApp addresses the source instance.
func (m *Migration) sourceApp() appctl.Target { return m.app(m.Pod) }

// app addresses the instance in pod.
func (m *Migration) app(pod string) appctl.Target {
	return appctl.Target{Namespace: m.Namespace, Pod: pod, Port: m.ControlPort}
}

// waitPrimary waits until the instance t consumes its primary queue.
func (m *Migration) waitPrimary(ctx context.Context, t appctl.Target) error {
	return wait.PollUntilContextCancel(ctx, appPollInterval, true, func(ctx context.Context) (bool, error) {
		st, err := m.App.State(ctx, t)
		return err == nil && st.Mode == ms2m.ModePrimary, nil
	})
}

// targetApp addresses the restored instance.
func (m *Migration) targetApp() appctl.Target { return m.app(m.TargetName) }

func (m *Migration) progress(phase report.PhaseName, msg string) {
	if m.Hooks.Progress != nil {
		m.Hooks.Progress(phase, msg)
	}
}

// tag identifies this stage of the migration.
func (m *Migration) tag() string {
	if m.stage == "" {
		return m.ID
	}
	return m.ID + "-" + m.stage
}

// nextAgentPod names the next agent pod of this stage.
func (m *Migration) nextAgentPod() string {
	m.agentPods++
	return "kubectl-migrate-agent-" + m.tag() + "-" + string(rune('a'+m.agentPods-1))
}

// nextStage is a migration from the pod this one restored (or from the
// source, for a stage that returns it) into name on node; it shares the
// broker, the record and what preflight learnt about the source.
func (m *Migration) nextStage(stage string, from *corev1.Pod, name, node string, strategy Strategy) *Migration {
	cfg := m.Config
	cfg.Pod, cfg.TargetName, cfg.TargetNode, cfg.Strategy = from.Name, name, node, strategy
	return &Migration{
		Config: cfg, Deps: m.Deps, Hooks: m.Hooks, Record: m.Record, stage: stage,
		Source: from, SourceNode: from.Spec.NodeName, Containers: m.Containers, broker: m.broker, SourceState: m.SourceState,
	}
}
