package migrate

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Shadow mode moves a StatefulSet pod with two MS2M switchovers instead of
// one long gap. Its identity cannot exist twice, so the source first moves
// into a differently named shadow on the target node while it keeps serving
// (the shadow lacks the pod-name label and is no member by name, so neither
// Services for the pod nor the controller take it); once the shadow has the
// primary queue, the StatefulSet is orphaned, the stopped source is deleted,
// and the shadow moves the same way into the StatefulSet's name on the same
// node, where the re-created StatefulSet adopts it. Each switchover is a gap
// of a replay tail, not of a restore.
//
// Until the final pod takes the primary queue everything rolls back: before
// the handover as any MS2M migration does; after it, by moving the shadow
// back into the StatefulSet's name on the source node and re-creating the
// StatefulSet. The move back is stop-and-copy: fewer steps that can fail
// during a rollback, at the price of one restore-long pause.

func shadowPhases() []Phase {
	shadow := func(p Phase) Phase { return inStage{Phase: p, stage: "shadow"} }
	final := func(p Phase) Phase { return inStage{Phase: p, stage: "final", onFinal: true} }
	return []Phase{
		preflight{}, setup{},
		shadow(prepare{}), shadow(checkpoint{}), shadow(packImages{}), shadow(restore{}), shadow(replay{}), shadow(handover{}),
		final(prepare{}), final(checkpoint{}), final(packImages{}), final(detach{}), final(restore{}), final(adopt{}),
		inStage{Phase: finalReplay{}, stage: "final"}, final(switchover{}), final(cleanup{}),
	}
}

// inStage labels a phase with its stage and, with onFinal, runs it on the
// final stage's migration (which handover creates).
type inStage struct {
	Phase
	stage   string
	onFinal bool
}

func (s inStage) Stage() string { return s.stage }

func (s inStage) traits() traits { return traitsOf(s.Phase) }

func (s inStage) Run(ctx context.Context, m *Migration) error {
	if !s.onFinal {
		return s.Phase.Run(ctx, m)
	}
	return s.Phase.Run(ctx, m.shadow.final)
}

func (s inStage) Rollback(ctx context.Context, m *Migration) error {
	if !s.onFinal {
		return s.Phase.Rollback(ctx, m)
	}
	if m.shadow.final == nil {
		return nil // the process died before the handover created the final stage
	}
	return s.Phase.Rollback(ctx, m.shadow.final)
}

// finalReplay is the final stage's replay (run on the shadow-mode
// migration, not on its final stage). Before it, the shadow, still
// serving, is asked for the first switchover's gap (readShadowGap): it has
// served through the final stage's checkpoint, image and restore by then,
// and the final pod's own history would show its replay of a message the
// shadow served long before.
type finalReplay struct{ replay }

func (p finalReplay) Run(ctx context.Context, m *Migration) error {
	m.readShadowGap(ctx)
	return p.replay.Run(ctx, m.shadow.final)
}

func (p finalReplay) Rollback(ctx context.Context, m *Migration) error {
	return p.replay.Rollback(ctx, m.shadow.final)
}

// shadowReadTimeout bounds readShadowGap's one question.
const shadowReadTimeout = 2 * time.Second

// readShadowGap asks the shadow, once and without waiting (the final stage
// is under way), for the first message it applied after the source's last,
// which gives the first switchover's gap. Called as the final stage's
// replay starts: the shadow has served for the final stage's checkpoint,
// image and restore by then.
func (m *Migration) readShadowGap(ctx context.Context) {
	if downtimeBound(m.state.SourceState, m.state.SourceFinal) == 0 {
		return // no traffic: no gap to measure
	}
	ctx, cancel := context.WithTimeout(ctx, shadowReadTimeout)
	defer cancel()
	if a, err := m.deps.App.AppliedAfter(ctx, m.targetApp(), m.state.SourceFinal.Position()); err == nil {
		m.shadow.gap = gapAfter(m.state.SourceFinal, a)
	}
}

// handover is the shadow's switchover: the source stops and the shadow takes
// the primary queue. It does not commit the migration, which can still go
// back, and it prepares the final stage.
type handover struct{}

func (handover) Name() report.PhaseName { return report.Switchover }

func (handover) Run(ctx context.Context, m *Migration) error {
	if err := (switchover{handover: true}).Run(ctx, m); err != nil {
		return err
	}
	if err := m.removeReplayQueueAndImages(ctx); err != nil {
		return err
	}
	m.startFinalStage(nil)
	return nil
}

// startFinalStage creates the stage that moves the shadow into the
// StatefulSet's name on the same node, fresh or (recovery) from its state.
func (m *Migration) startFinalStage(state *State) {
	m.shadow.final = m.nextStage("final", m.state.Target, m.config.Pod, m.config.TargetNode, MS2M, state)
	m.state.Final = m.shadow.final.state
}

// Rollback before the handover resumes the source; after it, it moves the
// shadow's state back into the StatefulSet's pod on the source node.
func (handover) Rollback(ctx context.Context, m *Migration) error {
	if !m.state.HandedOver {
		return resumeSource(ctx, m)
	}
	sts := m.state
	if m.shadow.final != nil {
		sts = m.shadow.final.state // the final stage orphaned the StatefulSet, if anyone did
	}
	m.progress(report.Switchover, "moving the shadow back into "+m.config.Pod+" on "+m.state.SourceNode)
	if err := m.moveBack(ctx, m.state.Target, sts); err != nil {
		return err
	}
	m.state.Target, m.state.TargetRequested, m.state.HandedOver, m.state.SourceHalted = nil, false, false, false
	if m.state.ReplayQueue != "" {
		return m.removeReplayQueueAndImages(ctx)
	}
	return nil
}

// moveBack moves the state of pod from (the shadow, or a StatefulSet pod's
// restored copy that replayed) into the StatefulSet's pod on the source
// node: stop it, checkpoint it, free the name, restore, re-create the
// StatefulSet from the spec saved in sts, and resume. If from never reached
// the source's last message, the returned copy first replays up to it from
// the replay queue, which is kept until then.
//
// The move back is stop-and-copy: fewer steps that can fail during a
// rollback, at the price of one restore-long pause.
func (m *Migration) moveBack(ctx context.Context, from *corev1.Pod, sts *State) error {
	back := m.nextStage("return", from, m.config.Pod, m.state.SourceNode, StopAndCopy, nil)
	// Its phases are the rollback's, not the migration's: progress only.
	back.Record, back.hooks, back.journal = &report.Record{}, Hooks{Progress: m.hooks.Progress}, nil
	back.state.SavedSTS, back.state.STSDeleted = sts.SavedSTS, sts.STSDeleted
	phases := []Phase{stopSource{}, checkpoint{}, packImages{}, detach{}, restore{}, adopt{},
		resumeReturned{replayQueue: m.state.ReplayQueue, until: m.state.SourceFinal.Position()}, cleanup{}}
	if err := back.run(ctx, phases, 0); err != nil {
		return fmt.Errorf("%w; the state lives on in pod %s, StatefulSet %s may need re-creating once it is moved", err, from.Name, m.config.StatefulSet)
	}
	sts.STSDeleted = back.state.STSDeleted
	return nil
}

// resumeReturned puts the pod moved back on its primary queue, replaying
// first if the pod it came from never got past the source.
type resumeReturned struct {
	replayQueue string
	until       protocol.Position
}

func (resumeReturned) Name() report.PhaseName { return report.Switchover }

func (r resumeReturned) Run(ctx context.Context, m *Migration) error {
	m.state.Committed = true
	return m.resumeRestored(ctx, m.targetApp(), r.replayQueue, r.until)
}

// Rollback has nothing to undo: the return is committed once it resumes.
func (resumeReturned) Rollback(context.Context, *Migration) error { return nil }

// Describe: the return is a rollback's, never planned.
func (resumeReturned) Describe(PlanStep) string { return "" }
