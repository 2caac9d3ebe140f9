package migrate

import (
	"testing"
	"time"
)

func feed(p *cutoffPolicy, t0 time.Time, lambda, mu float64, secs int) {
	for i := 0; i <= secs*10; i++ {
		dt := float64(i) / 10
		p.observe(rateSample{at: t0.Add(time.Duration(dt * float64(time.Second))), arrivals: uint64(100 + lambda*dt), applied: uint64(mu * dt)})
	}
}

func TestCutoffFromMeasuredRates(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	p := newCutoffPolicy(5*time.Second, 0)
	if d := p.decide(time.Hour); d.fire {
		t.Fatal("fired before any rate was measured")
	}
	feed(p, t0, 16, 20, 2)
	lambda, mu, ok := p.rates()
	if !ok || lambda < 15 || lambda > 17 || mu < 19 || mu > 21 {
		t.Fatalf("rates λ %.2f μ %.2f %v", lambda, mu, ok)
	}
	// T_cutoff = 5 s · 20 / 16 = 6.25 s after the bind.
	if d := p.decide(6 * time.Second); d.fire || d.cutoff < 6*time.Second || d.cutoff > 6500*time.Millisecond {
		t.Fatalf("at 6 s: %+v", d)
	}
	if d := p.decide(6300 * time.Millisecond); !d.fire {
		t.Fatalf("at 6.3 s: %+v", d)
	}
}

func TestCutoffFiresAtOnceWhenReplayCannotCatchUp(t *testing.T) {
	t.Parallel()
	p := newCutoffPolicy(5*time.Second, 0)
	feed(p, time.Now(), 20, 18, 2)
	if d := p.decide(0); !d.fire || d.because == "" {
		t.Fatalf("λ ≥ μ must cut off at once: %+v", d)
	}
}

func TestFixedCutoff(t *testing.T) {
	t.Parallel()
	p := newCutoffPolicy(0, 3*time.Second)
	if p.decide(2*time.Second).fire || !p.decide(3*time.Second).fire {
		t.Fatal("a fixed cutoff fires exactly at its time")
	}
	if newCutoffPolicy(0, 0).enabled() {
		t.Fatal("no flags, no cutoff")
	}
}

func TestRateWindowSlides(t *testing.T) {
	t.Parallel()
	p := newCutoffPolicy(5*time.Second, 0)
	t0 := time.Now()
	feed(p, t0, 10, 20, 5)
	// The rate changes: only the last window counts.
	for i := 1; i <= 40; i++ {
		at := t0.Add(5*time.Second + time.Duration(i)*100*time.Millisecond)
		p.observe(rateSample{at: at, arrivals: uint64(150 + 30*float64(i)/10), applied: uint64(100 + 20*float64(i)/10)})
	}
	if lambda, _, _ := p.rates(); lambda < 27 || lambda > 33 {
		t.Fatalf("λ %.1f, want the recent 30/s", lambda)
	}
}

// TestReplayWithoutCutoffGivesUpWhenItCannotCatchUp: without a cutoff, a
// target that replays no faster than messages arrive is given up on once μ
// was measured over a few seconds, not at --replay-timeout; one that gains
// is left to finish.
func TestReplayWithoutCutoffGivesUpWhenItCannotCatchUp(t *testing.T) {
	t.Parallel()
	slow := newCutoffPolicy(0, 0)
	feed(slow, time.Now(), 24, 20, 4)
	if why := slow.hopeless(2 * time.Second); why != "" {
		t.Fatalf("gave up before hopelessAfter: %s", why)
	}
	if why := slow.hopeless(hopelessAfter); why == "" {
		t.Fatal("λ 24/s > μ 20/s: replay cannot catch up, yet it goes on")
	}
	gaining := newCutoffPolicy(0, 0)
	feed(gaining, time.Now(), 16, 20, 4)
	if why := gaining.hopeless(time.Minute); why != "" {
		t.Fatalf("a target that gains was given up on: %s", why)
	}
}
