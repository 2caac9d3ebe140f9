//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// cordon sets a lab node's schedulability.
func (l *lab) cordon(t testing.TB, node string, unschedulable bool) {
	t.Helper()
	patch := []byte(`{"spec":{"unschedulable":` + map[bool]string{true: "true", false: "false"}[unschedulable] + `}}`)
	if _, err := l.client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestNodeDrain: node-a holds two bare consumers, a StatefulSet's two
// ordinals and a Deployment's two pods (MS2M), each workload's producer and
// a redis-server a client writes to without pause (no contract:
// checkpoint/restore); kubectl migrate node node-a --to node-b --parallel 2
// moves all of them alive: every message a producer confirmed, before or
// after it moved, is applied exactly once by each consumer, every write
// Redis acknowledged is in it afterwards (the same server), node-a is
// cordoned and runs none of them, and the Deployment's ReplicaSet adopted
// its copies and never made a pod.
func TestNodeDrain(t *testing.T) {
	took, sum := setup(t).drainNodeA(t)
	t.Logf("drain of 6 consumers, 4 producers and a Redis took %s; their migrations add up to %s", took, sum)
}

// BenchmarkNodeDrain measures the drain of TestNodeDrain against the sum of
// its six migrations (make bench).
func BenchmarkNodeDrain(b *testing.B) {
	l := setup(b)
	for range b.N {
		took, sum := l.drainNodeA(b)
		b.ReportMetric(float64(took.Milliseconds()), "drain-ms")
		b.ReportMetric(float64(sum.Milliseconds()), "sum-of-migrations-ms")
		b.ReportMetric(took.Seconds()/sum.Seconds(), "drain/sum-ratio")
	}
}

// drainNodeA runs the drain and checks it; it returns the drain's wall
// time and the sum of its migrations' total times.
func (l *lab) drainNodeA(t testing.TB) (took, sumOfMigrations time.Duration) {
	ctx := context.Background()
	bare := []*workload.Workload{l.deploy(t, "10"), l.deploy(t, "10")}
	// The StatefulSet's pods land on node-a because node-b is cordoned
	// while they are created; their template names each ordinal's queue.
	l.cordon(t, "node-b", true)
	t.Cleanup(func() { l.cordon(t, "node-a", false); l.cordon(t, "node-b", false) })
	sts, _ := l.deployStatefulSet(t, func(_ string, s *appsv1.StatefulSet) {
		s.Spec.Template.Spec.NodeSelector = nil
		id := strings.TrimPrefix(s.Spec.Template.Annotations[migrate.ExchangeAnnotation], "ms2m-")
		s.Spec.Template.Annotations[migrate.QueueAnnotation] = "work-" + id + "-$(POD_NAME)"
	})
	dep := l.startDeployment(t, func(d *appsv1.Deployment) { d.Spec.Template.Spec.NodeSelector = nil })
	l.cordon(t, "node-b", false)
	redisNS := l.startAnyPod(t, "redis", redisServerCommand...)
	writes := startRedisWrites(t, l, redisNS, "app=redis")
	before := map[string]uint64{}
	for _, p := range dep.pods {
		before[dep.ns+"/"+p] = waitApplied(t, dep.w, p, 10).LastSeq
	}
	for _, w := range bare {
		before[w.Namespace+"/consumer"] = waitApplied(t, w, "consumer", 10).LastSeq
	}
	for _, p := range []string{"consumer-0", "consumer-1"} {
		before[sts.Namespace+"/"+p] = waitApplied(t, sts, p, 10).LastSeq
	}

	// --registry for the pods without the contract's annotations.
	argv := []string{"migrate", "node", "node-a", "--to", "node-b", "--parallel", "2", "--allow-anonymous-checkpoints",
		"--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab", "--registry", l.registry + "/checkpoints", "--insecure-registry", "-o", "json"}
	cmd := l.kubectlCommand(argv...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	t0 := time.Now()
	out, err := cmd.Output()
	took = time.Since(t0)
	t.Logf("kubectl %s (%s):\n%s", strings.Join(argv, " "), took.Round(time.Millisecond), stderr.String())
	var rec report.Record
	if jerr := json.Unmarshal(out, &rec); jerr != nil || rec.Drain == nil {
		t.Fatalf("not a drain record (%v, %v):\n%s", err, jerr, out)
	}
	if err != nil || rec.Outcome != report.Succeeded {
		writes.stop()
		t.Fatalf("drain %v: %+v", err, rec.Drain)
	}
	moved := map[string]report.DrainMove{}
	var sum int64
	for _, m := range rec.Drain.Moves {
		moved[m.Namespace+"/"+m.Pod] = m
		sum += m.TotalMillis
	}
	// The producers and Redis move too, with checkpoint/restore.
	withoutContract := []string{redisNS + "/redis"}
	for _, ns := range []string{bare[0].Namespace, bare[1].Namespace, sts.Namespace, dep.ns} {
		withoutContract = append(withoutContract, ns+"/producer")
	}
	for _, name := range append(slices.Collect(maps.Keys(before)), withoutContract...) {
		if m, ok := moved[name]; !ok || m.Outcome != report.Succeeded || m.Target != "node-b" {
			writes.stop()
			t.Fatalf("%s not moved: %+v (left: %+v)", name, m, rec.Drain.Skipped)
		}
	}
	writes.check(t, "redis", "redis-"+moved[redisNS+"/redis"].Migration)
	n, err := l.client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil || !n.Spec.Unschedulable {
		t.Fatalf("node-a not cordoned after the drain: %v", err)
	}

	// Each consumer, where it now runs, applied every message exactly once.
	for _, w := range bare {
		if _, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, "consumer", metav1.GetOptions{}); !isNotFound(err) {
			t.Fatalf("the source consumer in %s is still there: %v", w.Namespace, err)
		}
		// A moved bare pod is named after its migration.
		checkConservation(t, w, "consumer-"+moved[w.Namespace+"/consumer"].Migration)
	}
	got, _ := checkOrdinalsConserve(t, sts)
	for _, p := range []string{"consumer-0", "consumer-1"} {
		pod, err := l.client.CoreV1().Pods(sts.Namespace).Get(ctx, p, metav1.GetOptions{})
		if err != nil || pod.Spec.NodeName != "node-b" {
			t.Fatalf("%s is not on node-b: %v", p, err)
		}
	}
	// The Deployment's: its ReplicaSet adopted both copies and made no pod.
	var copies []string
	for _, p := range dep.pods {
		copies = append(copies, p+"-"+moved[dep.ns+"/"+p].Migration)
	}
	dep.checkUnchanged(t, map[string]string{copies[0]: "node-b", copies[1]: "node-b"})
	dep.conserve(t, copies)
	t.Logf("conservation: every consumer applied all it was sent exactly once (consumer-0's digest %s)", got.Totals.Digest)
	return took.Round(time.Millisecond), time.Duration(sum) * time.Millisecond
}
