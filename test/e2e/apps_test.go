//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestInventoryExampleMigratesWithItsState migrates examples/inventory, an
// application written against the SDK with a state of its own (a stock
// ledger in memory, bodies of its own schema): live, with MS2M, and its
// ledger on the target after replay is exactly the one the producer booked
// over the orders the broker confirmed — not only the same message totals.
func TestInventoryExampleMigratesWithItsState(t *testing.T) {
	_, w, rec, before, after := migrateLiveApp(t, workload.Options{App: "inventory", Rate: "20"}, 40)
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
	_, w, rec, _, _ := migrateLiveApp(t, workload.Options{App: "python", Rate: "10"}, 30)
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

// TestExampleManifestsMigrate applies examples/manifests as a user would
// (kubectl apply, the EDIT values set: here the lab's images, broker and
// registry) and migrates the consumer live, with conservation.
func TestExampleManifestsMigrate(t *testing.T) {
	l := setup(t)
	ctx := context.Background()
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	ns := "e2e-manifests-" + id
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := workload.Attach(l.client, ns, "ms2m-demo-"+id, "ms2m-demo-"+id+".work")
	t.Cleanup(func() {
		if t.Failed() {
			l.dumpDiagnostics(t, w)
		}
		_ = w.Delete(context.Background())
	})
	edit := strings.NewReplacer(
		"ghcr.io/kubectl-migrate/", l.imagePrefix+"/", ":latest", ":lab",
		"amqp://guest:guest@rabbitmq.example:5672/", l.brokerURL,
		"registry.example:5000/checkpoints", l.registry+"/checkpoints",
		"ms2m-demo", "ms2m-demo-"+id,
		"spec:\n  containers:", "spec:\n  nodeName: node-a\n  containers:",
	)
	dir := t.TempDir()
	for _, name := range []string{"consumer-pod.yaml", "producer.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "manifests", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(edit.Replace(string(raw))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The namespace's default service account appears asynchronously.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := l.client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if out, err := l.kubectlCommand("apply", "-n", ns, "-f", filepath.Join(dir, "consumer-pod.yaml"), "-f", filepath.Join(dir, "producer.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	before := waitApplied(t, w, "consumer", 20)
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b")
	if err != nil {
		t.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	l.checkMigrated(t, w, rec, before)
	checkConservation(t, w, rec.TargetPod)
}
