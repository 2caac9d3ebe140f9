package migrate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// TestLostLockStopsTheMigration: another process changes the migration's
// lease while it replays (as a recovery that judged it expired would). The
// migration stops at once without touching the cluster again (no rollback,
// no journal write), and the recovery that took over brings it to an end
// with every message conserved.
func TestLostLockStopsTheMigration(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	lost := make(chan error, 1)
	var changesAtLoss int
	var journalAtLoss []byte
	hooks := migrate.Hooks{
		LockLost: func(err error) { lost <- err },
		PhaseStarted: func(p report.PhaseTiming) {
			if p.Name != report.Replay {
				return
			}
			w.ExpireLeases() // another process takes the lease over
			select {
			case err := <-lost:
				if !errors.Is(err, lease.ErrLost) {
					t.Errorf("lock lost with %v", err)
				}
			case <-time.After(time.Minute):
				t.Error("the migration never noticed that its lease was taken")
			}
			changesAtLoss, journalAtLoss = len(w.Changes()), w.Records()[0].Journal
		},
	}
	rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), hooks)
	if !errors.Is(err, lease.ErrLost) {
		t.Fatalf("the migration went on after losing its lock: %v", err)
	}
	if rec.Outcome.Final() {
		t.Fatalf("outcome %s: the migration decided its own end without its lock", rec.Outcome)
	}
	if after := w.Changes(); len(after) != changesAtLoss {
		t.Fatalf("changed the cluster after losing its lock: %v", after[changesAtLoss:])
	}
	stored := w.Records()[0]
	if string(stored.Journal) != string(journalAtLoss) || stored.Outcome != report.Running {
		t.Fatalf("the journal was written after the lock was lost (outcome %s)", stored.Outcome)
	}
	if got := recoverTwice(t, w, stored); got.Outcome != report.RolledBack {
		t.Fatalf("recovered to %s", got.Outcome)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
}
