package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// prepare makes sure every message the checkpointed state could lack is in
// the replay queue. It binds the replay queue, marks the source's state so
// that its restored copy holds until told to replay, and publishes a marker
// after the bind: once the source has taken the marker from its primary
// queue it has applied everything published before the replay queue existed
// (a backlog, or a message in flight), so a checkpoint taken from then on
// misses only messages the replay queue holds.
type prepare struct{}

func (prepare) Name() report.PhaseName { return report.Prepare }

func (prepare) Run(ctx context.Context, m *Migration) error {
	if err := m.markRunning(ctx); err != nil {
		return err
	}
	if err := m.createTargetEarly(ctx); err != nil {
		return err
	}
	m.state.ReplayQueue = protocol.ReplayQueueName(m.config.Broker.Queue)
	if err := m.broker.BindReplayQueue(ctx, m.config.Broker.Exchange, m.state.ReplayQueue); err != nil {
		return err
	}
	m.state.ReplayBound = time.Now()
	m.Record.Broker.ReplayQueue = m.state.ReplayQueue
	if _, err := m.deps.App.Control(ctx, m.sourceApp(), protocol.Control{Type: protocol.Prepare, Payload: protocol.ControlPayload{Queue: m.state.ReplayQueue, Migration: m.tag(), Target: m.targetIdentity()}}); err != nil {
		return err
	}
	if err := m.broker.PublishMarker(ctx, m.config.Broker.Exchange, m.tag()); err != nil {
		return err
	}
	err := wait.PollUntilContextCancel(ctx, appPollInterval, true, func(ctx context.Context) (bool, error) {
		st, err := m.deps.App.State(ctx, m.sourceApp())
		if err != nil {
			return false, err
		}
		return st.Barrier == m.tag(), nil
	})
	if err != nil {
		return fmt.Errorf("the source did not reach the marker behind its backlog: %w", err)
	}
	return nil
}

func (prepare) Rollback(ctx context.Context, m *Migration) error {
	if err := m.undoTargetEarly(ctx); err != nil {
		return err
	}
	var errs []error
	if _, err := m.deps.App.Control(ctx, m.sourceApp(), protocol.Control{Type: protocol.Checkpointed, Payload: protocol.ControlPayload{Migration: m.tag()}}); err != nil {
		errs = append(errs, fmt.Errorf("clear the source's checkpoint mark: %w", err))
	}
	if m.state.ReplayQueue != "" {
		errs = append(errs, m.broker.DeleteQueue(ctx, m.state.ReplayQueue))
	}
	return errors.Join(errs...)
}

// stopSource stops the source before anything else (stop-and-copy).
type stopSource struct{}

func (stopSource) Name() report.PhaseName { return report.Stop }

func (stopSource) Run(ctx context.Context, m *Migration) error {
	if err := m.markRunning(ctx); err != nil {
		return err
	}
	if err := m.createTargetEarly(ctx); err != nil {
		return err
	}
	return m.haltSource(ctx)
}

// haltSource stops the source and keeps its final state. The journal says
// "halted" first, so that a rollback after a crash resumes a source that may
// have stopped; Stop is idempotent, so a source whose answer was lost is
// asked again.
func (m *Migration) haltSource(ctx context.Context) error {
	if m.state.SourceHalted && m.state.SourceFinal.Process != "" {
		return nil // stopped already (a StatefulSet pod's source, or a recovery)
	}
	if err := m.journaled(ctx, &m.state.SourceHalted, true); err != nil {
		return err
	}
	st, err := m.deps.App.Control(ctx, m.sourceApp(), protocol.Control{Type: protocol.Stop, Payload: protocol.ControlPayload{Target: m.targetIdentity()}})
	if err != nil {
		return fmt.Errorf("stop the source: %w", err)
	}
	m.state.SourceFinal = st
	return nil
}

func (stopSource) Rollback(ctx context.Context, m *Migration) error {
	if err := m.undoTargetEarly(ctx); err != nil {
		return err
	}
	return resumeSource(ctx, m)
}

// targetIdentity names the pod the checkpoint is restored into, which the
// source keeps in its state: a copy restored into any other pod holds.
func (m *Migration) targetIdentity() string { return m.config.Namespace + "/" + m.config.TargetName }

// resumeSource puts a stopped source back on its primary queue. A
// StatefulSet pod's source gives its name to the restored copy: once the
// source is deleted, a resume sent to that name would reach the copy, which
// would consume the primary queue while the rollback still restores the
// source's own state (detach's rollback brings the source back instead).
func resumeSource(ctx context.Context, m *Migration) error {
	if !m.state.SourceHalted || m.state.SourceDeleted {
		return nil
	}
	if m.config.Pod == m.config.TargetName {
		pod, err := m.deps.Client.CoreV1().Pods(m.config.Namespace).Get(ctx, m.config.Pod, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("resume the source: %w", err)
		}
		if err != nil || pod.UID != m.state.Source.UID || pod.DeletionTimestamp != nil {
			return nil // the name no longer holds the source
		}
	}
	// A lazy checkpoint's source answers only once its page session ended.
	if err := m.awaitSourceResumed(ctx); err != nil {
		return err
	}
	if _, err := m.deps.App.Control(ctx, m.sourceApp(), protocol.Control{Type: protocol.Resume}); err != nil {
		return fmt.Errorf("resume the source: %w", err)
	}
	m.state.SourceHalted = false
	return nil
}
