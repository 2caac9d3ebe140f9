package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// replay has the target consume the replay queue, skipping what its restored
// state already holds, until it has caught up with the still-running source.
type replay struct{}

func (replay) Name() report.PhaseName { return report.Replay }

func (replay) traits() traits {
	return traits{timeout: func(m *Migration) time.Duration { return m.config.ReplayTimeout }}
}

func (replay) Run(ctx context.Context, m *Migration) error {
	backlog, err := m.broker.QueueDepth(ctx, m.state.ReplayQueue)
	if err != nil {
		return err
	}
	// Nothing consumed the replay queue since it was bound: its depth is
	// every arrival since then.
	if secs := time.Since(m.state.ReplayBound).Seconds(); secs > 0 {
		m.Record.Broker.ArrivalRate = float64(backlog) / secs
	}
	m.Record.Broker.ReplayBacklog = backlog
	m.state.ReplayStarted = time.Now() // from here the target consumes the replay queue
	if err := m.save(ctx); err != nil {
		return err
	}
	start, err := m.deps.App.Control(ctx, m.targetApp(), protocol.Control{Type: protocol.StartReplay, Payload: protocol.ControlPayload{Queue: m.state.ReplayQueue}})
	if err != nil {
		return err
	}
	m.progress(report.Replay, fmt.Sprintf("replaying %d buffered messages from %s", backlog, m.state.ReplayQueue))
	if err := m.thawAfterLastPage(ctx); err != nil {
		return err
	}
	policy := newCutoffPolicy(m.config.ReplayMax, m.config.Cutoff)
	if policy.enabled() {
		m.Record.Cutoff = &report.Cutoff{ReplayMaxMillis: m.config.ReplayMax.Milliseconds(), FixedMillis: m.config.Cutoff.Milliseconds()}
	}
	var target protocol.State
	err = wait.PollUntilContextCancel(ctx, appPollInterval, false, func(ctx context.Context) (bool, error) {
		// A source that already stopped (a StatefulSet pod) is caught up with
		// at its last message.
		source := m.state.SourceFinal
		if !m.state.SourceHalted {
			if source, err = m.deps.App.State(ctx, m.sourceApp()); err != nil {
				// A source whose process died restarts and answers again;
				// until then there is nothing to compare (replay's timeout
				// bounds the wait).
				m.progress(report.Replay, "the source does not answer yet: "+err.Error())
				return false, nil
			}
		}
		if target, err = m.deps.App.State(ctx, m.targetApp()); err != nil {
			return false, err
		}
		m.progress(report.Replay, fmt.Sprintf("target at %d, source at %d", target.LastSeq, source.LastSeq))
		if target.Reached(source.Position()) {
			return true, nil
		}
		depth, err := m.broker.QueueDepth(ctx, m.state.ReplayQueue)
		if err != nil {
			return false, err
		}
		// What reached the replay queue is what is in it plus what the target
		// took from it (applied or skipped).
		taken := target.Totals.Count + target.Skipped - start.Totals.Count - start.Skipped
		policy.observe(rateSample{at: time.Now(), arrivals: uint64(depth) + taken, applied: target.Totals.Count - start.Totals.Count})
		if !policy.enabled() {
			// A stopped source's last message is a fixed goal: only a
			// running source can stay ahead for good.
			if why := policy.hopeless(time.Since(m.state.ReplayStarted)); why != "" && !m.state.SourceHalted {
				return false, errReplayHopeless{why}
			}
			return false, nil
		}
		d := policy.decide(time.Since(m.state.ReplayBound))
		c := m.Record.Cutoff
		c.ArrivalRate, c.ServiceRate, c.CutoffMillis = d.lambda, d.mu, d.cutoff.Milliseconds()
		if d.fire {
			c.Fired, c.FiredAfterMillis, c.Reason = true, time.Since(m.state.ReplayBound).Milliseconds(), d.because
			m.progress(report.Replay, "cutoff: "+d.because+"; the source stops now and the target replays up to its last message")
		}
		return d.fire, nil
	})
	m.Record.Broker.Replayed = target.Totals.Count - start.Totals.Count
	var hopeless errReplayHopeless
	if errors.As(err, &hopeless) {
		return fmt.Errorf("%s (target at %d); use --replay-max (e.g. 10s) to stop the source and replay up to its last message, or --strategy stop-and-copy", hopeless.why, target.LastSeq)
	}
	if err != nil {
		return fmt.Errorf("the target did not catch up with the source (at %d): %w; raise --replay-timeout, or use --replay-max to cut off replay", target.LastSeq, err)
	}
	return nil
}

// errReplayHopeless ends a replay that cannot catch up, long before its
// timeout.
type errReplayHopeless struct{ why string }

func (e errReplayHopeless) Error() string { return e.why }

// Rollback has nothing to undo: the restored pod goes with restore's rollback.
func (replay) Rollback(context.Context, *Migration) error { return nil }
