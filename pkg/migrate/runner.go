package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Phase is one step of a migration.
type Phase interface {
	Name() report.PhaseName
	// Run does the phase's work.
	Run(ctx context.Context, m *Migration) error
	// Rollback undoes what Run did, as far as it got; it must be safe to call
	// after a Run that failed half-way.
	Rollback(ctx context.Context, m *Migration) error
}

// rollbackTimeout bounds the whole rollback, which runs even after the
// migration's context was cancelled (Ctrl-C).
const rollbackTimeout = 3 * time.Minute

// errInjected is the failure Config.InjectFailure asks for.
var errInjected = errors.New("failure injected with --inject-failure")

// ErrCommitted wraps failures after the target took over: the migration
// completed, but something in cleanup did not.
var ErrCommitted = errors.New("the target took over, but cleanup did not finish")

// run executes phases in order, times them, and rolls back on failure.
func (m *Migration) run(ctx context.Context, phases []Phase) error {
	start := time.Now()
	m.Record.StartedAt = start
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()

	for i, p := range phases {
		if err := m.runPhase(ctx, start, p); err != nil {
			if m.committed {
				m.Record.Outcome = report.Committed
				return fmt.Errorf("%w: %v", ErrCommitted, err)
			}
			if rbErr := m.rollback(ctx, phases[:i+1], err); rbErr != nil {
				return fmt.Errorf("%w; %v", err, rbErr)
			}
			return err
		}
		if p.Name() == report.Switchover {
			m.Record.TotalMillis = time.Since(start).Milliseconds()
		}
	}
	m.Record.Outcome = report.Succeeded
	return nil
}

func (m *Migration) runPhase(ctx context.Context, start time.Time, p Phase) error {
	name := p.Name()
	rec := report.Phase{Name: name}
	if s, ok := p.(interface{ Stage() string }); ok {
		rec.Stage = s.Stage()
	}
	if m.Hooks.PhaseStarted != nil {
		m.Hooks.PhaseStarted(rec)
	}
	phaseCtx, cancel := context.WithTimeout(ctx, m.phaseTimeout(name))
	t0 := time.Now()
	err := p.Run(phaseCtx, m)
	cancel()
	if err == nil && m.InjectFailure != "" && (m.InjectFailure == string(name) || m.InjectFailure == string(name)+"/"+rec.Stage) {
		err = errInjected
	}
	if err == nil && ctx.Err() != nil {
		err = context.Cause(ctx) // interrupted just as the phase ended
	}
	took := time.Since(t0)
	rec.StartMillis, rec.DurationMillis = t0.Sub(start).Milliseconds(), took.Milliseconds()
	if err != nil {
		where := string(name)
		if rec.Stage != "" {
			where += " (" + rec.Stage + " stage)"
		}
		err = fmt.Errorf("%s: %w", where, err)
		rec.Error = err.Error()
	}
	m.Record.Phases = append(m.Record.Phases, rec)
	if m.Hooks.PhaseFinished != nil {
		m.Hooks.PhaseFinished(rec, took, err)
	}
	return err
}

func (m *Migration) phaseTimeout(name report.PhaseName) time.Duration {
	if name == report.Replay {
		return m.ReplayTimeout
	}
	return m.PhaseTimeout
}

// rollback undoes phases in reverse order with a context of its own, so an
// interrupt that ended the migration does not also stop its rollback.
func (m *Migration) rollback(ctx context.Context, done []Phase, cause error) error {
	m.Record.Error = cause.Error()
	if m.KeepOnFailure {
		m.Record.Outcome = report.Failed
		return nil
	}
	if m.Hooks.RollbackStarted != nil {
		m.Hooks.RollbackStarted(cause)
	}
	rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	var errs []error
	for i := len(done) - 1; i >= 0; i-- {
		if err := done[i].Rollback(rbCtx, m); err != nil {
			errs = append(errs, fmt.Errorf("roll back %s: %w", done[i].Name(), err))
		}
		if i < len(m.Record.Phases) { // one record per phase run, in order
			m.Record.Phases[i].RolledBack = true
		}
	}
	m.Record.Outcome = report.RolledBack
	if len(errs) == 0 {
		return nil
	}
	m.Record.Outcome = report.Failed
	err := fmt.Errorf("rollback incomplete: %w", errors.Join(errs...))
	m.Record.Error += "; " + err.Error()
	return err
}
