package migrate_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// eventsOf lists pod's Events as "Type Reason: note", in order.
func eventsOf(t *testing.T, w *migratetest.World, pod string) []string {
	t.Helper()
	list, err := w.Client.EventsV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Name == pod {
			out = append(out, fmt.Sprintf("%s %s: %s", e.Type, e.Reason, e.Note))
		}
	}
	return out
}

// A migration tells the source and target pods' Events each phase and how
// it ended; a rollback says so as a warning. A dry run tells none.
func TestMigrationTellsThePodsEvents(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	if _, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{}); err != nil {
		t.Fatal(err)
	}
	source := strings.Join(eventsOf(t, w, "consumer"), "\n")
	for _, want := range []string{"Normal MigrationPhase: migration abcde (ms2m to node-b): preflight done in", "Normal MigrationPhase: migration abcde (ms2m to node-b): checkpoint done in", "Normal MigrationSucceeded"} {
		if !strings.Contains(source, want) {
			t.Errorf("the source's Events lack %q:\n%s", want, source)
		}
	}
	target := strings.Join(eventsOf(t, w, "consumer-abcde"), "\n")
	if !strings.Contains(target, "replay done in") || !strings.Contains(target, "Normal MigrationSucceeded") || strings.Contains(target, "preflight done") {
		t.Errorf("the target's Events, from its creation on:\n%s", target)
	}

	w = migratetest.NewWorld(t)
	w.FailAt = report.Replay
	if _, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{}); err == nil {
		t.Fatal("the injected failure did not fail the migration")
	}
	source = strings.Join(eventsOf(t, w, "consumer"), "\n")
	for _, want := range []string{"Warning MigrationPhaseFailed: migration abcde (ms2m to node-b): replay: ", "Warning MigrationRollingBack", "Warning MigrationRolledBack"} {
		if !strings.Contains(source, want) {
			t.Errorf("the source's Events lack %q:\n%s", want, source)
		}
	}

	w = migratetest.NewWorld(t)
	cfg := testConfig(migrate.MS2M)
	cfg.DryRun = true
	if _, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{}); err != nil {
		t.Fatal(err)
	}
	if got := eventsOf(t, w, "consumer"); len(got) != 0 {
		t.Errorf("a dry run told the pod %v", got)
	}
}
