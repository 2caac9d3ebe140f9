package migrate

import (
	"context"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// leaseNames are the migration's leases (pkg/lease), each with what it
// guards: its pod's and, for a StatefulSet pod, its StatefulSet's (two
// ordinals must not race the StatefulSet's delete and re-create).
func (m *Migration) leaseNames() (names, what []string) {
	names, what = []string{lease.Name("pod", m.config.Pod)}, []string{"pod " + m.config.Pod}
	if m.config.StatefulSet != "" {
		names = append(names, lease.Name("sts", m.config.StatefulSet))
		what = append(what, "StatefulSet "+m.config.StatefulSet)
	}
	return names, what
}

// checkLeasesFree refuses a migration whose leases another one holds,
// taking nothing.
func (m *Migration) checkLeasesFree(ctx context.Context) error {
	names, what := m.leaseNames()
	l := &lease.Set{Client: m.deps.Client, Namespace: m.config.Namespace, ID: m.config.ID}
	for i, name := range names {
		if err := l.Acquire(ctx, name, what[i], true, false); err != nil {
			return err
		}
	}
	return nil
}

// acquireLeases takes the migration's leases and keeps renewing them. With
// recovering, it takes over leases that this same migration left
// un-renewed.
func (m *Migration) acquireLeases(ctx context.Context, recovering bool) error {
	names, what := m.leaseNames()
	l := &lease.Set{Client: m.deps.Client, Namespace: m.config.Namespace, ID: m.config.ID, Lost: m.loseLock}
	if recovering {
		m.progress(report.Preflight, "taking over the migration's lock")
	}
	for i, name := range names {
		if err := l.Acquire(ctx, name, what[i], false, recovering); err != nil {
			l.Release(context.WithoutCancel(ctx))
			return err
		}
	}
	l.StartRenewing()
	m.leases = l
	return nil
}

// loseLock breaks the migration's fence and says so at once.
func (m *Migration) loseLock(err error) {
	m.fence.lose(err)
	if m.hooks.LockLost != nil {
		m.hooks.LockLost(err)
	}
}
