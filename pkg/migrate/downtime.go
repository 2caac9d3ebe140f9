package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// downtimeWait bounds how long the migration waits for the first message
// after the source's last one, to measure downtime.
const downtimeWait = 15 * time.Second

// downtimeBound is how long to wait for the message after first..last (the
// source's states at preflight and at its stop): a few inter-arrival times
// at the rate the source applied messages, within downtimeWait, and nothing
// if it applied none (no traffic, no downtime to measure).
func downtimeBound(first, last protocol.State) time.Duration {
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
// switchovers and downtime as their sum. The first is the shadow's, read
// from the shadow while it served (readShadowGap); the final pod's history
// would show the final pod's own replay of a message the shadow had served
// long before, when the final stage checkpointed the shadow first. If the
// shadow had not served one yet, the final pod's history is the truth.
func (m *Migration) measureGaps(ctx context.Context) (*report.Downtime, *report.Shadow) {
	if !m.config.Strategy.Contract() {
		return nil, nil // no messages to time: revealLabels timed it
	}
	if m.shadow.final == nil {
		return m.measureDowntime(ctx, m.state.SourceFinal), nil
	}
	toShadow := m.shadow.gap
	if toShadow == nil {
		toShadow = m.shadow.final.measureDowntime(ctx, m.state.SourceFinal)
	}
	toFinal := m.shadow.final.measureDowntime(ctx, m.shadow.final.state.SourceFinal)
	if toShadow == nil || toFinal == nil {
		return nil, nil
	}
	shadow := &report.Shadow{Pod: m.config.TargetName, ToShadowMillis: toShadow.Millis, ToFinalMillis: toFinal.Millis}
	toFinal.Millis += toShadow.Millis
	return toFinal, shadow
}

// measureDowntime computes downtime from the instances' own timestamps: the
// source's last applied message N, and the target applying N+1.
func (m *Migration) measureDowntime(ctx context.Context, last protocol.State) *report.Downtime {
	bound := downtimeBound(m.state.SourceState, last)
	if bound == 0 {
		m.progress(report.Cleanup, "the source applied no message during the migration: no downtime to measure")
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	var next protocol.Applied
	err := wait.PollUntilContextCancel(ctx, appPollInterval, true, func(ctx context.Context) (bool, error) {
		a, err := m.deps.App.AppliedAfter(ctx, m.targetApp(), last.Position())
		if errors.Is(err, appctl.ErrNotApplied) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		next = a
		return true, nil
	})
	if err != nil {
		m.progress(report.Cleanup, fmt.Sprintf("no message within %s after the switchover to measure downtime with", bound.Round(100*time.Millisecond)))
		return nil
	}
	return gapAfter(last, next)
}

// gapAfter is the downtime between the source's last applied message and
// the target applying the next one, next. If next was sent after the source
// stopped, waiting only began when it was sent.
func gapAfter(last protocol.State, next protocol.Applied) *report.Downtime {
	waitingSince := last.LastAppliedAt
	if next.Sent.After(waitingSince) {
		waitingSince = next.Sent
	}
	// A target that replayed past the source's last message before the
	// source stopped left no gap at all.
	return &report.Downtime{
		Millis:              max(0, next.AppliedAt.Sub(waitingSince).Milliseconds()),
		SourceLastSeq:       last.LastSeq,
		SourceLastAppliedAt: last.LastAppliedAt,
		NextSeq:             next.Seq,
		NextSentAt:          next.Sent,
		NextAppliedAt:       next.AppliedAt,
	}
}
