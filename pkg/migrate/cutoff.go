package migrate

import (
	"fmt"
	"time"
)

// cutoffPolicy decides when to stop waiting for replay to catch up, after the
// paper's threshold-based cutoff. Messages accumulate from the replay queue's
// bind; with arrival rate λ and the target's processing rate μ, a backlog
// built over T takes about λ·T/μ to replay, so keeping replay within
// T_replay_max means stopping the source by T_cutoff = T_replay_max·μ/λ after
// the bind. λ and μ are measured, not given: λ from the replay queue
// (depth plus what the target took from it), μ from the target's own
// progress, over a sliding window, re-estimated at every observation.
type cutoffPolicy struct {
	replayMax time.Duration // 0: no threshold cutoff
	fixed     time.Duration // --cutoff: a fixed T_cutoff instead
	window    time.Duration
	samples   []rateSample
}

type rateSample struct {
	at       time.Time
	arrivals uint64 // messages that reached the replay queue since the bind
	applied  uint64 // messages the target applied since replay started
}

// minRateSpan is how much replay must have been seen before μ is trusted.
const minRateSpan = time.Second

func newCutoffPolicy(replayMax, fixed time.Duration) *cutoffPolicy {
	return &cutoffPolicy{replayMax: replayMax, fixed: fixed, window: 3 * time.Second}
}

func (p *cutoffPolicy) enabled() bool { return p.replayMax > 0 || p.fixed > 0 }

func (p *cutoffPolicy) observe(s rateSample) {
	p.samples = append(p.samples, s)
	for len(p.samples) > 2 && s.at.Sub(p.samples[1].at) >= p.window {
		p.samples = p.samples[1:]
	}
}

// rates returns λ and μ in messages per second over the window.
func (p *cutoffPolicy) rates() (lambda, mu float64, ok bool) {
	if len(p.samples) < 2 {
		return 0, 0, false
	}
	first, last := p.samples[0], p.samples[len(p.samples)-1]
	span := last.at.Sub(first.at)
	if span < minRateSpan {
		return 0, 0, false
	}
	secs := span.Seconds()
	return float64(last.arrivals-first.arrivals) / secs, float64(last.applied-first.applied) / secs, true
}

// hopelessAfter is how long replay runs before a target that does not gain
// on the source is given up on (without a cutoff): long enough for μ to be
// measured over a full window, short against --replay-timeout.
const hopelessAfter = 5 * time.Second

// hopeless says, sinceReplay after replay started, why replay without a
// cutoff will not catch up (λ ≥ μ over the window), or "" while it may.
func (p *cutoffPolicy) hopeless(sinceReplay time.Duration) string {
	lambda, mu, ok := p.rates()
	if !ok || sinceReplay < hopelessAfter || mu > lambda {
		return ""
	}
	return fmt.Sprintf("messages arrive at λ %.1f/s, the target replays at μ %.1f/s: replay cannot catch up", lambda, mu)
}

// decision is the policy's answer at one moment.
type decision struct {
	fire    bool
	cutoff  time.Duration // T_cutoff, once known
	lambda  float64
	mu      float64
	because string
}

// decide says whether to cut off now, sinceBind after the replay queue was
// bound.
func (p *cutoffPolicy) decide(sinceBind time.Duration) decision {
	if p.fixed > 0 {
		return decision{fire: sinceBind >= p.fixed, cutoff: p.fixed, because: "fixed cutoff reached"}
	}
	lambda, mu, ok := p.rates()
	if !ok || p.replayMax == 0 {
		return decision{}
	}
	d := decision{lambda: lambda, mu: mu}
	if mu <= 0 || lambda >= mu {
		d.fire, d.because = true, fmt.Sprintf("λ %.1f/s ≥ μ %.1f/s: replay would never catch up", lambda, mu)
		return d
	}
	d.cutoff = time.Duration(float64(p.replayMax) * mu / lambda)
	d.fire = sinceBind >= d.cutoff
	d.because = fmt.Sprintf("T_cutoff %s reached (T_replay_max %s · μ %.1f/s / λ %.1f/s)", d.cutoff.Round(time.Millisecond), p.replayMax, mu, lambda)
	if late := sinceBind - d.cutoff; late > time.Second {
		// μ is only known once the target replays; if checkpoint, transfer
		// and restore outlast T_cutoff, replay cannot stay within the bound.
		d.because += fmt.Sprintf(", %s late: restore outlasted T_cutoff, so replay will exceed T_replay_max; raise --replay-max", late.Round(100*time.Millisecond))
	}
	return d
}
