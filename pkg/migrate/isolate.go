package migrate

import (
	"context"
	"fmt"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// isolateSource cuts a source that does not follow the MS2M contract off
// the network before its checkpoint (CheckpointRestore). Such a process
// cannot be told to stop: the kubelet's checkpoint leaves it running (CRI-O
// pauses it for the dump and resumes it, and refuses to checkpoint one that
// is frozen), so whatever it acknowledged after the dump would be lost with
// it. Cut off, it neither hears a request nor answers one: what its
// clients saw acknowledged is in the checkpoint. The cut holds until the
// source is deleted; a rollback lifts it.
type isolateSource struct{}

func (isolateSource) Name() report.PhaseName { return report.Stop }

func (isolateSource) Run(ctx context.Context, m *Migration) error {
	if err := m.createTargetEarly(ctx); err != nil {
		return err
	}
	return m.isolate(ctx)
}

func (isolateSource) Rollback(ctx context.Context, m *Migration) error {
	if err := m.undoTargetEarly(ctx); err != nil {
		return err
	}
	return m.unisolate(ctx)
}

// isolate cuts the source off; the journal says so first, so that a
// rollback after a crash lifts a cut that may have been made.
func (m *Migration) isolate(ctx context.Context) error {
	if m.state.SourceIsolated {
		return nil
	}
	m.state.IsolatedAt = time.Now()
	if err := m.journaled(ctx, &m.state.SourceIsolated, true); err != nil {
		return err
	}
	if _, err := m.deps.Packer.Fence(ctx, m.state.SourceNode, string(m.state.Source.UID), false); err != nil {
		return fmt.Errorf("cut pod %s off the network: %w", m.config.Pod, err)
	}
	m.progress(report.Stop, "pod "+m.config.Pod+" cut off the network: from now on nothing it does reaches anyone")
	return nil
}

// unisolate lets the source back on the network, through the source
// node's agent (a recovery starts one).
func (m *Migration) unisolate(ctx context.Context) error {
	if !m.state.SourceIsolated {
		return nil
	}
	if err := m.agentOn(ctx, m.state.SourceNode); err != nil {
		return err
	}
	if _, err := m.deps.Packer.Fence(ctx, m.state.SourceNode, string(m.state.Source.UID), true); err != nil {
		return fmt.Errorf("let pod %s back on the network: %w", m.config.Pod, err)
	}
	m.state.SourceIsolated = false
	m.progress(report.Stop, "pod "+m.config.Pod+" back on the network")
	return nil
}

// revealLabels gives the copy the labels it was created without
// (State.HiddenLabels): Services and controllers select it from then on.
// For a copy without the MS2M contract that is when its clients reach it
// again, which ends the downtime.
func (m *Migration) revealLabels(ctx context.Context) error {
	if err := m.giveHiddenLabels(ctx, m.config.TargetName); err != nil {
		return err
	}
	if !m.state.IsolatedAt.IsZero() && m.Record.Downtime == nil {
		m.Record.Downtime = &report.Downtime{Millis: time.Since(m.state.IsolatedAt).Milliseconds()}
	}
	return nil
}

// giveHiddenLabels gives pod (created without them) the source's labels of
// State.HiddenLabels.
func (m *Migration) giveHiddenLabels(ctx context.Context, pod string) error {
	if len(m.state.HiddenLabels) == 0 {
		return nil
	}
	revealed := map[string]string{}
	for _, k := range m.state.HiddenLabels {
		if v, ok := m.state.Source.Labels[k]; ok {
			revealed[k] = v
		}
	}
	if err := m.patchPod(ctx, pod, map[string]any{"metadata": map[string]any{"labels": revealed}}); err != nil {
		return fmt.Errorf("give %s the source's labels: %w", pod, err)
	}
	return nil
}
