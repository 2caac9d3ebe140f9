package migrate

import (
	"context"
	"errors"
	"fmt"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// ErrNothingToRecover is returned for a migration that ended for good.
var ErrNothingToRecover = errors.New("nothing to recover")

// Recover brings the migration of record rec to a safe end from its journal
// alone, without the process that started it: a migration past its commit
// point completes forward from the phase it was in, any other rolls back
// what it had done. It is idempotent: interrupted, it leaves a journal that
// the next Recover carries on from. brokerURL replaces the journal's broker
// URL, which holds no password.
func Recover(ctx context.Context, rec *report.Record, brokerURL string, deps Deps, hooks Hooks) (*report.Record, error) {
	j, ok, err := ReadJournal(rec)
	if err != nil {
		return rec, err
	}
	if !ok {
		if rec.Outcome.Final() {
			return rec, fmt.Errorf("migration %s %s: %w", rec.ID, rec.Outcome, ErrNothingToRecover)
		}
		return rec, fmt.Errorf("migration %s (%s) keeps no journal to recover from", rec.ID, rec.Outcome)
	}
	if deps.JournalKey == nil {
		return rec, errors.New("no journal key to check the journal with")
	}
	key, err := deps.JournalKey(ctx)
	if err != nil {
		return rec, err
	}
	if err := checkJournalSigned(key, rec); err != nil {
		return rec, err
	}
	cfg := j.Config
	cfg.Broker.URL = brokerURL
	j.State.restorePasswords(brokerURL)
	if cfg.Strategy.Contract() {
		if cfg.ControlToken, err = ControlToken(ctx, deps.Client, cfg.Namespace); err != nil {
			return rec, err // the journal keeps no token
		}
	}
	cfg.DryRun, cfg.KeepOnFailure, cfg.InjectFailure = false, false, ""
	m := newMigration(cfg, deps, hooks, j.State, rec)
	if err := m.acquireLeases(ctx, true); err != nil {
		return rec, err
	}
	defer m.closeBroker()
	defer m.closeEvents()
	if cfg.Strategy.Contract() { // a migration without the contract has no broker
		b, err := deps.DialBroker(ctx, brokerURL)
		if err != nil {
			// b may be a typed nil: m.broker stays unset.
			m.leases.Abandon(context.WithoutCancel(ctx))
			return rec, fmt.Errorf("%w; pass --broker-url with an address this machine reaches", err)
		}
		m.broker = b
	}
	if m.state.Final != nil {
		m.startFinalStage(m.state.Final) // after the dial: stages share the broker
	}
	phases := Phases(cfg.Strategy, cfg.StatefulSet != "", cfg.Mode)
	started := min(len(rec.Phases), len(phases))
	if started == 0 {
		return rec, errors.Join(errors.New("the journal names no phase"), m.finish(ctx))
	}
	if m.committed() {
		from := started - 1
		if last := rec.Phases[from]; !last.Running && last.Error == "" {
			from++ // it had finished
		}
		m.progress(report.Preflight, "committed: completing the migration")
		err = m.run(ctx, phases, from)
	} else {
		cause := errors.New("recovered: " + firstOf(rec.Error, "the process running the migration stopped"))
		err = m.rollback(ctx, phases[:started], cause)
	}
	return rec, errors.Join(err, m.finish(ctx))
}

func firstOf(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
