package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Phases returns the phase list of a strategy, for a bare pod or (with
// statefulSet) a StatefulSet pod in mode.
func Phases(s Strategy, statefulSet bool, mode StatefulSetMode) []Phase {
	if statefulSet && mode == Shadow {
		return shadowPhases()
	}
	if statefulSet {
		switch s {
		case CheckpointRestore:
			// The copy is restored without the labels anything selects by
			// (clients reaching it before the commit would lose their writes
			// to a rollback), so its StatefulSet adopts it only once the
			// switchover has given them back.
			return []Phase{preflight{}, setup{}, isolateSource{}, checkpoint{}, packImages{}, detach{}, restore{}, switchover{}, adopt{}, cleanup{}}
		case StopAndCopy:
			return []Phase{preflight{}, setup{}, stopSource{}, checkpoint{}, packImages{}, detach{}, restore{}, adopt{}, switchover{}, cleanup{}}
		}
		return []Phase{preflight{}, setup{}, prepare{}, checkpoint{}, packImages{}, detach{}, restore{}, adopt{}, replay{}, switchover{}, cleanup{}}
	}
	switch s {
	case CheckpointRestore:
		return []Phase{preflight{}, setup{}, isolateSource{}, checkpoint{}, packImages{}, restore{}, switchover{}, cleanup{}}
	case StopAndCopy:
		return []Phase{preflight{}, setup{}, stopSource{}, checkpoint{}, packImages{}, restore{}, switchover{}, cleanup{}}
	default:
		return []Phase{preflight{}, setup{}, prepare{}, checkpoint{}, packImages{}, restore{}, replay{}, switchover{}, cleanup{}}
	}
}

// newMigration builds the top-level migration of cfg around state and
// record, with the journal that saves them.
func newMigration(cfg Config, deps Deps, hooks Hooks, state *State, record *report.Record) *Migration {
	m := &Migration{config: cfg, deps: deps, hooks: hooks, state: state, Record: record, fence: newFence(), receivers: &receivers{}, warm: &nodeSet{}}
	if !cfg.DryRun {
		m.journal = &journal{config: &m.config, state: state, record: record, store: deps.Records, key: deps.JournalKey}
		m.events = kube.NewPodEvents(deps.Client, "kubectl-migrate-"+cfg.ID)
	}
	return m
}

// Run migrates one pod and returns its record, which it has also saved
// (unless this was a dry run). The record is returned even on failure.
func Run(ctx context.Context, cfg Config, deps Deps, hooks Hooks) (*report.Record, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rec := &report.Record{
		ID: cfg.ID, Strategy: string(cfg.Strategy), Mode: string(cfg.Mode), Namespace: cfg.Namespace, Pod: cfg.Pod,
		TargetNode: cfg.TargetNode, Labels: cfg.Labels, Outcome: report.Running,
	}
	cfg = stagedConfig(cfg) // the first stage of shadow mode restores the shadow
	m := newMigration(cfg, deps, hooks, &State{}, rec)
	defer m.closeBroker()
	defer m.closeEvents()
	phases := Phases(cfg.Strategy, cfg.StatefulSet != "", cfg.Mode)
	readying := unjournaledHead(phases)
	if cfg.DryRun {
		phases = phases[:readying] // they change nothing of the workload
		if cfg.ReadOnly {
			phases = phases[:1] // setup starts agents and binds a probe queue
		}
	}
	err := m.run(ctx, phases, 0)
	if cfg.DryRun && err == nil {
		m.Record.Prediction, err = m.predict(ctx, lambdaWindow)
	}
	if len(m.Record.Phases) <= readying {
		// A dry run, or refused before anything of the workload changed:
		// nothing to record, and what setup readied goes even where no
		// rollback undid it (the plan was all that was asked for, or
		// --keep-on-failure, which keeps wreckage, not machinery).
		if ran, ok := m.Record.Phase(report.Setup); ok && !ran.RolledBack {
			err = errors.Join(err, setup{}.Rollback(ctx, m))
		}
		m.leases.Release(context.WithoutCancel(ctx))
		return m.Record, err
	}
	return m.Record, errors.Join(err, m.finish(ctx))
}

// unjournaledHead is how many phases at the head of phases journal nothing
// (preflight and setup).
func unjournaledHead(phases []Phase) int {
	n := 0
	for n < len(phases) && traitsOf(phases[n]).unjournaled {
		n++
	}
	return n
}

// Recoverable reports whether a process that dies in p leaves a journal to
// finish or undo the migration from; one that dies in preflight or setup
// leaves only what ends by itself (see setup).
func Recoverable(p Phase) bool { return !traitsOf(p).unjournaled }

// finish measures what a committed migration achieved, saves the record and
// gives up the leases. A migration that did not end for good keeps its
// journal and its leases (no longer renewed), which point at recovery.
func (m *Migration) finish(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if m.committed() && m.Record.Downtime == nil {
		m.Record.Downtime, m.Record.Shadow = m.measureGaps(ctx)
	}
	if lost := m.fence.broken(); lost != nil {
		// Another process may be recovering it: touch nothing, its agents
		// included (they idle out).
		m.leases.Abandon(ctx)
		return fmt.Errorf("%w; the journal is left to %s", lost, RecoverCommand(m.config.Namespace, m.config.ID))
	}
	m.releaseAgents(ctx)
	if !m.Record.Outcome.Final() {
		m.leases.Abandon(ctx)
		if err := m.save(ctx); err != nil {
			return fmt.Errorf("%w; the journal could not be kept either: what was changed is in the errors above", err)
		}
		return nil
	}
	if m.state.MigrationQueue != "" {
		if err := m.broker.DeleteQueue(ctx, m.state.MigrationQueue); err != nil {
			// Restored copies would hold on a restart; keep the journal so
			// that recovery deletes it.
			m.leases.Abandon(ctx)
			return errors.Join(fmt.Errorf("delete queue %s: %w", m.state.MigrationQueue, err), m.save(ctx))
		}
	}
	m.Record.Journal = nil // nothing left to finish or undo
	// The migration ended for good: its locks go even if its record cannot
	// be written (say, the caller may not update ConfigMaps), or they would
	// refuse every later migration of the pod.
	defer m.leases.Release(ctx)
	if err := m.deps.Records.Save(ctx, m.Record); err != nil {
		if m.Record.Outcome == report.Succeeded {
			return fmt.Errorf("migration succeeded but %w", err)
		}
		return err
	}
	return nil
}

// releaseAgents ends the migration's agents; one left would only idle out.
func (m *Migration) releaseAgents(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := m.deps.Packer.Release(ctx); err != nil {
		m.progress(report.Cleanup, "agent pods not removed: "+err.Error())
	}
}

func (m *Migration) closeBroker() {
	if m.broker != nil {
		_ = m.broker.Close()
	}
}
