package migrate

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// lambdaWindow is how long a dry run counts the workload's arrivals.
const lambdaWindow = 3 * time.Second

// defaultCriticalPath stands in for the checkpoint → restored-copy-holding
// time when no earlier migration of the workload says better: the
// project's own target for it, conservative on the lab (1.2–1.9 s there).
const defaultCriticalPath = 3 * time.Second

// predict measures λ on the workload's exchange (a probe queue bound for
// lambdaWindow, then deleted), takes μ, the critical path and the other
// phases from the earlier migrations of the same queue, and works out
// replay, total and downtime for the configured strategy.
func (m *Migration) predict(ctx context.Context) (*report.Prediction, error) {
	p := &report.Prediction{}
	probe := m.Broker.Queue + ".ms2m-probe-" + m.ID
	if err := m.broker.BindReplayQueue(ctx, m.Broker.Exchange, probe); err != nil {
		return nil, fmt.Errorf("bind a probe queue to measure λ: %w", err)
	}
	select {
	case <-time.After(lambdaWindow): // the measuring window itself
	case <-ctx.Done():
	}
	depth, err := m.broker.QueueDepth(context.WithoutCancel(ctx), probe)
	if derr := m.broker.DeleteQueue(context.WithoutCancel(ctx), probe); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return nil, fmt.Errorf("measure λ on probe queue %s: %w", probe, err)
	}
	p.Lambda = float64(depth) / lambdaWindow.Seconds()
	p.LambdaWindowMillis = lambdaWindow.Milliseconds()

	history := m.history(ctx)
	p.FromRuns = len(history)
	median := func(f func(*report.Record) (float64, bool)) (float64, bool) {
		var v []float64
		for _, r := range history {
			if x, ok := f(r); ok {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			return 0, false
		}
		slices.Sort(v)
		return v[len(v)/2], true
	}
	phase := func(name report.PhaseName) time.Duration {
		ms, _ := median(func(r *report.Record) (float64, bool) {
			ph, ok := r.Phase(name)
			return float64(ph.DurationMillis), ok
		})
		return time.Duration(ms) * time.Millisecond
	}
	critical := defaultCriticalPath
	if ms, ok := median(func(r *report.Record) (float64, bool) {
		return float64(r.CriticalPathMillis()), r.CriticalPathMillis() > 0
	}); ok {
		critical = time.Duration(ms) * time.Millisecond
	}
	p.CriticalPathMillis = critical.Milliseconds()
	if mu, ok := median(func(r *report.Record) (float64, bool) {
		ph, ok := r.Phase(report.Replay)
		return float64(r.Broker.Replayed) / (float64(ph.DurationMillis) / 1000), ok && ph.DurationMillis > 0 && r.Broker.Replayed > 0
	}); ok {
		p.Mu = mu
	}
	// What the source applies while the target is restored waits in the
	// replay queue: λ times prepare and the critical path.
	before := phase(report.Prepare) + critical
	p.Backlog = p.Lambda * before.Seconds()
	rest := phase(report.Preflight) + phase(report.Switchover) + phase(report.Cleanup)
	if rest == 0 {
		rest = 3 * time.Second // preflight ≈ 1.3 s and cleanup ≈ 1 s on the lab
	}
	switch {
	case m.Strategy == StopAndCopy:
		// Nothing is applied from the stop to the restored copy's first
		// message, which has waited in the primary queue.
		p.DowntimeMillis = (critical + phase(report.Stop) + phase(report.Switchover)).Milliseconds()
		p.TotalMillis = (rest + critical + phase(report.Stop)).Milliseconds()
	case p.Mu == 0:
		p.Warnings = append(p.Warnings, "no earlier migration of this queue measured μ (the target's replay rate): the first one does; replay time unknown")
		p.TotalMillis = (rest + before).Milliseconds()
	case p.Lambda >= p.Mu:
		p.Warnings = append(p.Warnings, fmt.Sprintf("λ %.1f/s ≥ μ %.1f/s: replay would never catch up; use --replay-max (threshold cutoff) or --strategy stop-and-copy", p.Lambda, p.Mu))
	default:
		replay := time.Duration(p.Backlog / (p.Mu - p.Lambda) * float64(time.Second))
		p.ReplayMillis = replay.Milliseconds()
		p.TotalMillis = (rest + before + replay).Milliseconds()
		// One message's service time: the switchover's gap.
		p.DowntimeMillis = int64(1000 / p.Mu)
		if m.ReplayMax == 0 && p.Lambda > 0.8*p.Mu {
			p.Warnings = append(p.Warnings, fmt.Sprintf("λ is %.0f%% of μ: replay is long and sensitive to bursts; --replay-max bounds it", 100*p.Lambda/p.Mu))
		}
	}
	return p, nil
}

// history is the earlier successful MS2M migrations of this workload's
// queue (their replay queue names it), newest first, at most ten: they
// measured μ and the critical path on this cluster.
func (m *Migration) history(ctx context.Context) []*report.Record {
	all, err := report.Store{Client: m.Client}.List(ctx, m.Namespace)
	if err != nil {
		return nil
	}
	var out []*report.Record
	for _, r := range all {
		if r.Outcome == report.Succeeded && r.Broker.ReplayQueue == ms2m.ReplayQueueName(m.Broker.Queue) {
			out = append(out, r)
		}
		if len(out) == 10 {
			break
		}
	}
	return out
}
