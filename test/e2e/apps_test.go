//go:build e2e

package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestInventoryExampleMigratesWithItsState migrates examples/inventory, an
// application written against the SDK with a state of its own (a stock
// ledger in memory, bodies of its own schema): live, with MS2M, and its
// ledger on the target after replay is exactly the one the producer booked
// over the orders the broker confirmed — not only the same message totals.
func TestInventoryExampleMigratesWithItsState(t *testing.T) {
	l := setup(t)
	w := l.deployWith(t, workload.Options{App: "inventory", Rate: "20"})
	before := waitApplied(t, w, "consumer", 40)
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b")
	if err != nil {
		t.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	after := l.checkMigrated(t, w, rec, before)
	var was, is struct {
		SKUs   int    `json:"skus"`
		Digest string `json:"digest"`
	}
	if json.Unmarshal(before.App, &was) != nil || json.Unmarshal(after.App, &is) != nil || was.SKUs == 0 || is.Digest == "" {
		t.Fatalf("the inventory reports no ledger: before %s, after %s", before.App, after.App)
	}
	// The ledger the restored copy holds is the source's, carried by the
	// checkpoint and caught up by replay: CheckConservation compares it
	// with the producer's once both are at the same message.
	checkConservation(t, w, rec.TargetPod)
}

// TestPythonConsumerMigratesLive migrates examples/python, a consumer that
// shares no code with the Go SDK, live with MS2M: restored (same process),
// nothing lost or applied twice, and its sum equal to the producer's.
func TestPythonConsumerMigratesLive(t *testing.T) {
	l := setup(t)
	w := l.deployWith(t, workload.Options{App: "python", Rate: "10"})
	before := waitApplied(t, w, "consumer", 30)
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b")
	if err != nil {
		t.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	l.checkMigrated(t, w, rec, before)
	checkConservation(t, w, rec.TargetPod)
}

// TestPythonStatefulSetSequential moves ordinal 0 of a StatefulSet of
// Python consumers in sequential mode.
func TestPythonStatefulSetSequential(t *testing.T) {
	migrateStatefulSet(t, func(_ string, sts *appsv1.StatefulSet) {
		c := &sts.Spec.Template.Spec.Containers[0]
		c.Image = strings.Replace(c.Image, "/ms2m-consumer:", "/python-consumer:", 1)
	}, "--strategy", "ms2m")
}
