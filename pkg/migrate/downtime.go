package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// downtimeWait bounds how long the migration waits for the first message
// after the source's last one, to measure downtime.
const downtimeWait = 15 * time.Second

// downtimeBound is how long to wait for the message after first..last (the
// source's states at preflight and at its stop): a few inter-arrival times
// at the rate the source applied messages, within downtimeWait, and nothing
// if it applied none (no traffic, no downtime to measure).
func downtimeBound(first, last ms2m.State) time.Duration {
	if last.Producer != first.Producer {
		return downtimeWait // the producer restarted: messages flow, at a rate not known
	}
	if last.LastSeq <= first.LastSeq || !last.LastAppliedAt.After(first.LastAppliedAt) {
		return 0
	}
	rate := float64(last.LastSeq-first.LastSeq) / last.LastAppliedAt.Sub(first.LastAppliedAt).Seconds()
	return min(downtimeWait, 2*time.Second+time.Duration(5/rate*float64(time.Second)))
}

// measureGaps measures downtime; in shadow mode, the gap at each of the two
// switchovers (both seen by the final pod, which carries the shadow's
// history) and downtime as their sum.
func (m *Migration) measureGaps(ctx context.Context) (*report.Downtime, *report.Shadow) {
	if m.final == nil {
		return m.measureDowntime(ctx, m.SourceFinal), nil
	}
	toShadow := m.final.measureDowntime(ctx, m.SourceFinal)
	toFinal := m.final.measureDowntime(ctx, m.final.SourceFinal)
	if toShadow == nil || toFinal == nil {
		return nil, nil
	}
	shadow := &report.Shadow{Pod: m.TargetName, ToShadowMillis: toShadow.Millis, ToFinalMillis: toFinal.Millis}
	toFinal.Millis += toShadow.Millis
	return toFinal, shadow
}

// measureDowntime computes downtime from the instances' own timestamps: the
// source's last applied message N, and the target applying N+1. If N+1 was
// sent after the source stopped, waiting only began when it was sent.
func (m *Migration) measureDowntime(ctx context.Context, last ms2m.State) *report.Downtime {
	bound := downtimeBound(m.SourceState, last)
	if bound == 0 {
		m.progress(report.Cleanup, "the source applied no message during the migration: no downtime to measure")
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var next struct {
		seq             uint64
		sent, appliedAt time.Time
	}
	err := wait.PollUntilContextCancel(ctx, appPollInterval, true, func(ctx context.Context) (bool, error) {
		a, err := m.App.AppliedAfter(ctx, m.targetApp(), last.Position())
		if errors.Is(err, appctl.ErrNotApplied) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		next.seq, next.sent, next.appliedAt = a.Seq, a.Sent, a.AppliedAt
		return true, nil
	})
	if err != nil {
		m.progress(report.Cleanup, fmt.Sprintf("no message within %s after the switchover to measure downtime with", bound.Round(100*time.Millisecond)))
		return nil
	}
	waitingSince := last.LastAppliedAt
	if next.sent.After(waitingSince) {
		waitingSince = next.sent
	}
	// A target that replayed past the source's last message before the
	// source stopped left no gap at all.
	return &report.Downtime{
		Millis:              max(0, next.appliedAt.Sub(waitingSince).Milliseconds()),
		SourceLastSeq:       last.LastSeq,
		SourceLastAppliedAt: last.LastAppliedAt,
		NextSeq:             next.seq,
		NextSentAt:          next.sent,
		NextAppliedAt:       next.appliedAt,
	}
}
