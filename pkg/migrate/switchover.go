package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/util/retry"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// switchover stops the source and hands the primary queue to the target.
//
// With MS2M the target keeps consuming the replay queue (which still gets
// every message) while the source stops, so nothing waits while the target
// is idle: told the source's last sequence N, the target replays up to N and
// then moves to the primary queue, where it skips the tail it already has.
// With stop-and-copy the source stopped long ago and the target simply
// resumes the primary queue.
//
// Once the target is told to take the primary queue the migration is
// committed: rolling back then could lose what the target consumed. A
// shadow's handover marks the handover instead, which can still go back.
type switchover struct{ handover bool }

func (switchover) Name() report.PhaseName { return report.Switchover }

func (switchover) traits() traits { return traits{endsTotal: true} }

func (s switchover) Run(ctx context.Context, m *Migration) error {
	if !m.config.Strategy.Contract() {
		// The copy runs already; the migration commits, then lets the
		// source's clients reach the copy (a ReplicaSet's copy, once its
		// ReplicaSet adopts it in cleanup).
		if err := m.journaled(ctx, &m.state.Committed, true); err != nil {
			return err
		}
		if m.state.ReplicaSet != "" {
			return nil
		}
		return m.revealLabels(ctx)
	}
	handover := protocol.Control{Type: protocol.Resume}
	if m.config.Strategy == MS2M {
		if err := m.haltSource(ctx); err != nil {
			return err
		}
		handover = protocol.EndReplayAt(m.state.SourceFinal.Position())
	}
	if depth, err := m.broker.QueueDepth(ctx, m.config.Broker.Queue); err == nil {
		m.Record.Broker.PrimaryDepthAtSwitch = depth
	}
	passed := &m.state.Committed
	if s.handover {
		passed = &m.state.HandedOver
	}
	if err := m.journaled(ctx, passed, true); err != nil {
		return err
	}
	// The handover is idempotent, so a lost answer is simply asked again.
	err := retry.OnError(retry.DefaultBackoff, func(error) bool { return ctx.Err() == nil }, func() error {
		_, err := m.deps.App.Control(ctx, m.targetApp(), handover)
		return err
	})
	if err != nil {
		return fmt.Errorf("hand the primary queue to the target: %w", err)
	}
	m.progress(report.Switchover, fmt.Sprintf("source stopped at %d; target takes over the primary queue", m.state.SourceFinal.LastSeq))
	if err := m.waitPrimary(ctx, m.targetApp()); err != nil {
		return fmt.Errorf("the target did not reach the primary queue: %w", err)
	}
	if c := m.Record.Cutoff; c != nil {
		// After a cutoff the target finishes its replay here, behind the
		// stopped source; measured on this machine's clock, to within a poll.
		c.ReplayMillis = time.Since(m.state.ReplayStarted).Milliseconds()
	}
	return nil
}

func (switchover) Rollback(ctx context.Context, m *Migration) error {
	return resumeSource(ctx, m)
}

// cleanup removes the source pod, the replay queue and, if asked, the
// checkpoint images. The migration is committed: failures here are reported
// but undo nothing.
type cleanup struct{}

func (cleanup) Name() report.PhaseName { return report.Cleanup }

func (cleanup) Run(ctx context.Context, m *Migration) error {
	var errs []error
	if m.state.ReplicaSet != "" {
		if err := m.handToReplicaSet(ctx); err != nil {
			// The source stays the ReplicaSet's (stopped), rather than
			// leave it one pod short.
			return errors.Join(err, m.removeReplayQueueAndImages(ctx))
		}
	}
	if m.config.Pod != m.config.TargetName { // a source that held its name is gone already
		m.progress(report.Cleanup, "deleting source pod "+m.config.Pod)
		if err := kube.DeleteAndWait(ctx, m.deps.Client, m.config.Namespace, m.config.Pod, m.deleteGrace()); err != nil {
			errs = append(errs, err)
		}
	}
	// The archives a StatefulSet pod's rollback would have restored from.
	return errors.Join(append(errs, m.removeArchives(ctx), m.removeReplayQueueAndImages(ctx))...)
}

// removeReplayQueueAndImages deletes the replay queue and (unless asked to
// keep them) the checkpoint images, once the target no longer needs them.
func (m *Migration) removeReplayQueueAndImages(ctx context.Context) error {
	var errs []error
	if m.state.ReplayQueue != "" {
		if err := m.broker.DeleteQueue(ctx, m.state.ReplayQueue); err != nil {
			errs = append(errs, err)
		}
		m.state.ReplayQueue = ""
	}
	return errors.Join(append(errs, m.path().release(ctx, m))...)
}

func (cleanup) Rollback(context.Context, *Migration) error { return nil }
