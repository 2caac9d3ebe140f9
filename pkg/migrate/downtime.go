package migrate

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// downtimeWait bounds how long the migration waits for the first message
// after the source's last one, to measure downtime; with no traffic there is
// no downtime to measure.
const downtimeWait = 15 * time.Second

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
	ctx, cancel := context.WithTimeout(ctx, downtimeWait)
	defer cancel()
	var next struct {
		seq             uint64
		sent, appliedAt time.Time
	}
	err := wait.PollUntilContextCancel(ctx, appPollInterval, true, func(ctx context.Context) (bool, error) {
		a, err := m.App.AppliedAfter(ctx, m.targetApp(), last.LastSeq)
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
		m.progress(report.Cleanup, "no message after the switchover to measure downtime with")
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
