package migrate

import (
	"context"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// lambdaWindow is how long a dry run counts the workload's arrivals;
// a migration counts them during its setup, for at least
// lambdaMinWindow (setup takes longer where agents start: 1.3–3 s on
// the lab).
const (
	lambdaWindow    = 3 * time.Second
	lambdaMinWindow = time.Second
)

// defaultCriticalPath stands in for the checkpoint → restored-copy-holding
// time when no earlier migration of the workload says better: the
// project's own target for it, conservative on the lab (1.2–1.9 s there).
const defaultCriticalPath = 3 * time.Second

// probeExpiry is how long the broker keeps a probe queue nobody uses: a
// process that dies while it measures leaves the queue only this long.
const probeExpiry = 30 * time.Second

// lambdaProbe is a queue bound to the workload's exchange that counts the
// arrivals since it was bound.
type lambdaProbe struct {
	queue   string
	started time.Time
}

// startLambdaProbe binds the probe queue the prediction measures λ with,
// during setup (shadow mode predicts nothing). A probe that cannot be
// bound costs the prediction only.
func (m *Migration) startLambdaProbe(ctx context.Context) {
	if m.config.Mode == Shadow || !m.config.Strategy.Contract() || (m.config.PredictWindow < 0 && !m.config.DryRun) {
		return
	}
	queue := m.config.Broker.Queue + ".ms2m-probe-" + m.config.ID
	if err := m.broker.BindProbeQueue(ctx, m.config.Broker.Exchange, queue, probeExpiry); err != nil {
		m.progress(report.Setup, "no prediction: "+err.Error())
		return
	}
	m.probe = &lambdaProbe{queue: queue, started: time.Now()}
}

// dropProbe deletes the probe queue, if one is bound.
func (m *Migration) dropProbe(ctx context.Context) error {
	if m.probe == nil {
		return nil
	}
	queue := m.probe.queue
	m.probe = nil
	return m.broker.DeleteQueue(context.WithoutCancel(ctx), queue)
}

// predict reads λ from the probe queue once it has counted for at least
// window, takes μ from earlier migrations of the same queue or else from
// the application's own service time, the critical path and the other
// phases from the cluster's recent migrations of the same kind, and works
// out replay, total and downtime for the configured strategy. Without a
// probe it predicts nothing. A move without the MS2M contract predicts its
// freeze from the pod's memory instead (FreezeModel).
func (m *Migration) predict(ctx context.Context, window time.Duration) (*report.Prediction, error) {
	if !m.config.Strategy.Contract() && m.state.Source != nil {
		// Its clients wait through the freeze, which grows with its memory.
		f := NewFreezeModel(m.deps.Client, m.config.Namespace).Predict(ctx, m.state.Source)
		return &report.Prediction{Freeze: f, DowntimeMillis: f.Millis, FromRuns: f.FromRuns}, nil
	}
	if m.probe == nil {
		return nil, nil
	}
	select {
	case <-time.After(time.Until(m.probe.started.Add(window))): // the measuring window itself
	case <-ctx.Done():
	}
	counted := time.Since(m.probe.started)
	queue := m.probe.queue
	depth, err := m.broker.QueueDepth(context.WithoutCancel(ctx), queue)
	if derr := m.dropProbe(ctx); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return nil, fmt.Errorf("measure λ on probe queue %s: %w", queue, err)
	}
	p := &report.Prediction{Lambda: float64(depth) / counted.Seconds(), LambdaWindowMillis: counted.Milliseconds()}

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
	sameQueue := func(r *report.Record) bool {
		return r.Broker.ReplayQueue == protocol.ReplayQueueName(m.config.Broker.Queue)
	}
	if mu, ok := median(func(r *report.Record) (float64, bool) {
		rate := r.ReplayRate()
		return rate, sameQueue(r) && rate > 0
	}); ok {
		p.Mu, p.MuFrom = mu, report.MuFromHistory
	} else if ms := m.state.SourceState.ServiceMillis; ms > 0 {
		p.Mu, p.MuFrom = 1000/ms, report.MuFromApplication
	}
	// What the source applies while the target is restored waits in the
	// replay queue: λ times prepare and the critical path.
	before := phase(report.Prepare) + critical
	p.Backlog = p.Lambda * before.Seconds()
	rest := phase(report.Preflight) + phase(report.Setup) + phase(report.Switchover) + phase(report.Cleanup)
	if rest == 0 {
		rest = 3 * time.Second // preflight and setup ≈ 1.3 s, cleanup ≈ 1 s on the lab
	}
	switch {
	case m.config.Strategy == StopAndCopy:
		// Nothing is applied from the stop to the restored copy's first
		// message, which has waited in the primary queue.
		p.DowntimeMillis = (critical + phase(report.Stop) + phase(report.Switchover)).Milliseconds()
		p.TotalMillis = (rest + critical + phase(report.Stop)).Milliseconds()
	case p.Mu == 0:
		p.Warnings = append(p.Warnings, "neither an earlier migration of this queue nor the application (serviceMillis in its state) tells μ, the target's processing rate: replay time unknown")
		p.TotalMillis = (rest + before).Milliseconds()
	case p.Lambda >= p.Mu:
		p.Warnings = append(p.Warnings, fmt.Sprintf("λ %.1f/s ≥ μ %.1f/s: replay would never catch up; use --replay-max (threshold cutoff) or --strategy stop-and-copy", p.Lambda, p.Mu))
	default:
		replay := time.Duration(p.Backlog / (p.Mu - p.Lambda) * float64(time.Second))
		p.ReplayMillis = replay.Milliseconds()
		p.TotalMillis = (rest + before + replay).Milliseconds()
		// One message's service time: the switchover's gap.
		p.DowntimeMillis = int64(1000 / p.Mu)
		if m.config.ReplayMax == 0 && p.Lambda > 0.8*p.Mu {
			p.Warnings = append(p.Warnings, fmt.Sprintf("λ is %.0f%% of μ: replay is long and sensitive to bursts; --replay-max bounds it", 100*p.Lambda/p.Mu))
		}
	}
	return p, nil
}

// history is the cluster's recent successful migrations of the same
// strategy and mode (of this namespace when the cluster's cannot be
// listed), newest first, at most ten: they measured the critical path and
// the phases on this cluster, and those of this queue μ.
func (m *Migration) history(ctx context.Context) []*report.Record {
	return recentRecords(ctx, m.deps.Client, m.config.Namespace, 10, func(r *report.Record) bool {
		return r.Outcome == report.Succeeded && r.Strategy == string(m.config.Strategy) && r.Mode == string(m.config.Mode) && r.ID != m.config.ID
	})
}

// recentRecords is the cluster's newest records that keep holds for (of
// namespace when the cluster's cannot be listed), at most n.
func recentRecords(ctx context.Context, client kubernetes.Interface, namespace string, n int, keep func(*report.Record) bool) []*report.Record {
	store := report.Store{Client: client}
	all, err := store.List(ctx, metav1.NamespaceAll)
	if err != nil {
		if all, err = store.List(ctx, namespace); err != nil {
			return nil
		}
	}
	var out []*report.Record
	for _, r := range all {
		if len(out) == n {
			break
		}
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}
