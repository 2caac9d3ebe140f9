package migrate

import (
	"context"
	"fmt"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Phases returns the phase list of a strategy, for a bare pod or (with
// statefulSet) a StatefulSet pod in mode.
func Phases(s Strategy, statefulSet bool, mode Mode) []Phase {
	if statefulSet && mode == Shadow {
		return shadowPhases()
	}
	if statefulSet {
		if s == StopAndCopy {
			return []Phase{preflight{}, stopSource{}, checkpoint{}, packImages{}, detach{}, restore{}, adopt{}, switchover{}, cleanup{}}
		}
		return []Phase{preflight{}, prepare{}, checkpoint{}, packImages{}, detach{}, restore{}, adopt{}, replay{}, switchover{}, cleanup{}}
	}
	switch s {
	case StopAndCopy:
		return []Phase{preflight{}, stopSource{}, checkpoint{}, packImages{}, restore{}, switchover{}, cleanup{}}
	default:
		return []Phase{preflight{}, prepare{}, checkpoint{}, packImages{}, restore{}, replay{}, switchover{}, cleanup{}}
	}
}

// Run migrates one pod and returns its record, which it has also saved
// (unless this was a dry run). The record is returned even on failure.
func Run(ctx context.Context, cfg Config, deps Deps, hooks Hooks) (*report.Record, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Migration{Config: cfg, Deps: deps, Hooks: hooks}
	m.Record = &report.Record{
		ID: cfg.ID, Strategy: string(cfg.Strategy), Mode: string(cfg.Mode), Namespace: cfg.Namespace, Pod: cfg.Pod,
		TargetNode: cfg.TargetNode, Labels: cfg.Labels,
	}
	if cfg.StatefulSet != "" && cfg.Mode == Shadow {
		m.TargetName = ShadowName(cfg.Pod) // the first stage restores the shadow
	}
	defer func() {
		if m.broker != nil {
			_ = m.broker.Close()
		}
	}()
	phases := Phases(cfg.Strategy, cfg.StatefulSet != "", cfg.Mode)
	if cfg.DryRun {
		phases = phases[:1]
	}
	err := m.run(ctx, phases)
	if cfg.DryRun {
		return m.Record, err
	}
	if m.committed {
		m.Record.Downtime, m.Record.Shadow = m.measureGaps(context.WithoutCancel(ctx))
	}
	saveCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if len(m.Record.Phases) < 2 {
		return m.Record, err // preflight failed before anything changed: nothing to record
	}
	if saveErr := deps.Records.Save(saveCtx, m.Record); saveErr != nil {
		if err == nil {
			return m.Record, fmt.Errorf("migration succeeded but %w", saveErr)
		}
	}
	return m.Record, err
}
