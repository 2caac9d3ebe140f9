package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Phase is one step of a migration.
type Phase interface {
	Name() report.PhaseName
	// Describe says what Run will do, for the dry-run plan ("" for
	// nothing worth a line): the plan is built from the very list that runs.
	Describe(s PlanStep) string
	// Run does the phase's work.
	Run(ctx context.Context, m *Migration) error
	// Rollback undoes what Run did, as far as it got; it must be safe to call
	// after a Run that failed half-way, or was cut short by the death of the
	// process that ran it (recovery calls it from the journal).
	Rollback(ctx context.Context, m *Migration) error
}

// traits is what the runner does around a phase beyond Run and Rollback; a
// phase declares it with a traits method, and the zero value suits most.
type traits struct {
	// unjournaled: no journal is saved around it, since nothing it does
	// needs recovery: preflight changes nothing, and what setup readies ends
	// by itself. Only the head of a phase list may be unjournaled.
	unjournaled bool
	// endsTotal: the migration's total time is taken when it succeeds (the
	// switchover that completes it).
	endsTotal bool
	// timeout, if set, bounds its Run instead of Config.PhaseTimeout.
	timeout func(*Migration) time.Duration
}

// traitsOf is p's traits, the zero value if it declares none.
func traitsOf(p Phase) traits {
	if t, ok := p.(interface{ traits() traits }); ok {
		return t.traits()
	}
	return traits{}
}

// rollbackTimeout bounds the whole rollback, which runs even after the
// migration's context was cancelled (Ctrl-C).
const rollbackTimeout = 3 * time.Minute

// errInjected is the failure Config.InjectFailure asks for.
var errInjected = errors.New("failure injected with --inject-failure")

// ErrCommitted wraps failures after the target took over: the migration
// completed, but something in cleanup did not.
var ErrCommitted = errors.New("the target took over, but cleanup did not finish")

// RecoverCommand is the command that finishes or undoes migration id.
var RecoverCommand = report.RecoverCommand

// run executes phases in order from the phase at index from (0, or where a
// recovered migration stopped), times them, and rolls back on failure.
func (m *Migration) run(ctx context.Context, phases []Phase, from int) error {
	if m.Record.StartedAt.IsZero() {
		m.Record.StartedAt = time.Now()
	}
	ctx, cancel := context.WithTimeout(ctx, m.config.Timeout)
	defer cancel()
	ctx, unbind := m.fence.bind(ctx)
	defer unbind()

	for i := from; i < len(phases); i++ {
		p := phases[i]
		if err := m.runPhase(ctx, i, p); err != nil {
			if lost := m.fence.broken(); lost != nil {
				m.Record.Error = err.Error()
				return err // no rollback: that is for whoever holds the lock now
			}
			if m.committed() {
				m.Record.Outcome = report.Committed
				return fmt.Errorf("%w: %v", ErrCommitted, err)
			}
			if rbErr := m.rollback(ctx, phases[:i+1], err); rbErr != nil {
				return fmt.Errorf("%w; %v", err, rbErr)
			}
			return err
		}
		if traitsOf(p).endsTotal {
			m.Record.TotalMillis = time.Since(m.Record.StartedAt).Milliseconds()
		}
	}
	m.Record.Outcome = report.Succeeded
	return nil
}

// committed reports whether the migration (any of its stages) has passed its
// commit point.
func (m *Migration) committed() bool {
	return m.state.Committed || m.shadow.final != nil && m.shadow.final.state.Committed
}

// runPhase runs the phase at index i of the record's phase list: the journal
// names it before it starts, so a process that dies in it leaves a journal
// that says where.
func (m *Migration) runPhase(ctx context.Context, i int, p Phase) error {
	name, traits := p.Name(), traitsOf(p)
	rec := report.PhaseTiming{Name: name, Running: true}
	if s, ok := p.(interface{ Stage() string }); ok {
		rec.Stage = s.Stage()
	}
	if i < len(m.Record.Phases) { // a recovered migration runs it again
		m.Record.Phases[i] = rec
	} else {
		m.Record.Phases = append(m.Record.Phases, rec)
	}
	entry := &m.Record.Phases[i]
	m.phase = i
	t0 := time.Now()
	entry.StartMillis = t0.Sub(m.Record.StartedAt).Milliseconds()
	var err error
	if !traits.unjournaled {
		err = m.save(ctx)
	}
	if m.hooks.PhaseStarted != nil {
		m.hooks.PhaseStarted(rec)
	}
	if err == nil {
		timeout := m.config.PhaseTimeout
		if traits.timeout != nil {
			timeout = traits.timeout(m)
		}
		phaseCtx, cancel := context.WithTimeout(ctx, timeout)
		err = p.Run(phaseCtx, m)
		cancel()
	}
	if err == nil && m.config.InjectFailure != "" && (m.config.InjectFailure == string(name) || m.config.InjectFailure == string(name)+"/"+rec.Stage) {
		err = errInjected
	}
	if err == nil && ctx.Err() != nil {
		err = context.Cause(ctx) // interrupted just as the phase ended
	}
	took := time.Since(t0)
	entry.DurationMillis, entry.Running = took.Milliseconds(), false
	if err != nil {
		where := string(name)
		if rec.Stage != "" {
			where += " (" + rec.Stage + " stage)"
		}
		err = fmt.Errorf("%s: %w", where, err)
		entry.Error = err.Error()
	}
	if !traits.unjournaled {
		// Best effort: a journal that still says "running" makes recovery
		// run or undo this phase again, which every phase allows.
		_ = m.save(context.WithoutCancel(ctx))
	}
	if m.hooks.PhaseFinished != nil {
		m.hooks.PhaseFinished(*entry, took, err)
	}
	if err != nil {
		m.event(corev1.EventTypeWarning, "MigrationPhaseFailed", err.Error())
	} else {
		m.event(corev1.EventTypeNormal, "MigrationPhase", fmt.Sprintf("%s done in %s", rec.Label(), took.Round(time.Millisecond)))
	}
	return err
}

// event tells the source pod and, once it exists, the target pod's Events
// what happened to the migration (kubectl describe pod shows it).
func (m *Migration) event(eventType, reason, note string) {
	note = fmt.Sprintf("migration %s (%s to %s): %s", m.config.ID, m.config.Strategy, m.config.TargetNode, note)
	m.events.Record(m.state.Source, eventType, reason, "Migrate", note)
	if t := m.state.Target; t != nil && (m.state.Source == nil || t.UID != m.state.Source.UID) {
		m.events.Record(t, eventType, reason, "Migrate", note)
	}
}

// closeEvents tells the pods how the migration ended and waits, briefly,
// until its Events are written.
func (m *Migration) closeEvents() {
	if m.events == nil {
		return
	}
	switch m.Record.Outcome {
	case report.Succeeded:
		m.event(corev1.EventTypeNormal, "MigrationSucceeded", "the target serves")
	case report.RolledBack:
		m.event(corev1.EventTypeWarning, "MigrationRolledBack", "the source serves: "+m.Record.Error)
	case report.Failed, report.Committed:
		m.event(corev1.EventTypeWarning, "MigrationUnfinished", "its journal is kept: "+RecoverCommand(m.config.Namespace, m.config.ID))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m.events.Close(ctx)
}

// leftoverError is an undo that failed on something nothing depends on any
// more (a checkpoint image the registry would not delete): the rollback goes
// on, and the record names it for removal by hand.
type leftoverError struct {
	what string
	err  error
}

func (e leftoverError) Error() string { return e.what + ": " + e.err.Error() }
func (e leftoverError) Unwrap() error { return e.err }

// rollback undoes phases in reverse order with a context of its own, so an
// interrupt that ended the migration does not also stop its rollback. It
// stops at the first undo step that fails: the steps before it (deleting the
// checkpoint images and the replay queue among them) could destroy the last
// copy of the state, so they are left, with the journal, for recovery.
func (m *Migration) rollback(ctx context.Context, done []Phase, cause error) error {
	m.Record.Error = cause.Error()
	if m.config.KeepOnFailure {
		m.Record.Outcome = report.Failed
		return nil
	}
	if m.hooks.RollbackStarted != nil {
		m.hooks.RollbackStarted(cause)
	}
	m.event(corev1.EventTypeWarning, "MigrationRollingBack", "rolling back ("+cause.Error()+"): the source keeps serving")
	rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	rbCtx, unbind := m.fence.bind(rbCtx)
	defer unbind()
	for i := len(done) - 1; i >= 0; i-- {
		if i < len(m.Record.Phases) && m.Record.Phases[i].RolledBack {
			continue // undone before the process that ran it died
		}
		err := m.fence.broken()
		if err == nil {
			err = done[i].Rollback(rbCtx, m)
		}
		var left leftoverError
		if errors.As(err, &left) {
			// Nothing depends on it any more: note it and go on undoing.
			m.Record.Leftovers = append(m.Record.Leftovers, left.what)
			m.progress(done[i].Name(), "left behind: "+left.Error())
			err = nil
		}
		if err != nil {
			m.Record.Outcome = report.Failed
			err = fmt.Errorf("rollback stopped at %s: %w; what it had not undone yet is kept, with the journal: %s", done[i].Name(), err, RecoverCommand(m.config.Namespace, m.config.ID))
			m.Record.Error += "; " + err.Error()
			return err
		}
		if i < len(m.Record.Phases) { // one record per phase run, in order
			m.Record.Phases[i].RolledBack = true
		}
		if !traitsOf(done[i]).unjournaled {
			_ = m.save(rbCtx)
		}
	}
	m.Record.Outcome = report.RolledBack
	return nil
}
