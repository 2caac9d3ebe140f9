//go:build e2e

package e2e

import (
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestSoak migrates one live consumer (10 msg/s) back and forth between the
// nodes 20 times, cycling through the strategies and transfers, and after
// every fifth run a StatefulSet's ordinal 0 (sequential mode) the same way,
// checking after each run that every message so far was applied exactly
// once (the sequence is contiguous from 1: count and digest of 1..N), and at
// the end full conservation against each producer and that every count is
// back at its baseline: pods, replay and migration queues, leases, archives
// on the nodes, checkpoint images in the registry (deleted by default), one
// record per run. Each run's figures go to a CSV (E2E_SOAK_CSV, default in
// the test's temporary directory, named in the log). make soak runs it.
func TestSoak(t *testing.T) {
	if os.Getenv("E2E_SOAK") == "" {
		t.Skip("20 back-to-back migrations: make soak runs it (E2E_SOAK=1)")
	}
	const runs = 20
	variants := [][]string{
		{"--strategy", "ms2m"},
		{"--strategy", "stop-and-copy"},
		{"--strategy", "ms2m", "--transfer", "direct"},
		{"--strategy", "ms2m", "--replay-max", "4s"},
	}
	l := setup(t)
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 20)
	set := l.startStatefulSet(t, 20)
	ctx := context.Background()
	baseline := map[string]int{}
	for _, ns := range []string{w.Namespace, set.w.Namespace} {
		pods, err := l.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		baseline[ns] = len(pods.Items)
	}

	path := os.Getenv("E2E_SOAK_CSV")
	if path == "" {
		path = filepath.Join(t.TempDir(), "soak.csv")
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := csv.NewWriter(f)
	_ = out.Write([]string{"run", "id", "pod", "variant", "from", "to", "outcome", "total_ms", "downtime_ms", "critical_path_ms", "overhead_ms", "holding_ms", "applied"})

	otherNode := map[string]string{"node-a": "node-b", "node-b": "node-a"}
	var images []string
	var holding []int64 // per pod run: what the restored process needed to reconnect and hold
	run := 0
	migrate := func(w *workload.Workload, kind, pod, node string, variant ...string) report.Record {
		t.Helper()
		to := otherNode[node]
		args := append([]string{kind, pod, "--to", to, "--label", "soak=" + strconv.Itoa(run)}, variant...)
		rec, stderr, err := l.migrate(t, w, args...)
		if err != nil || rec.Outcome != report.Succeeded {
			t.Fatalf("run %d (%v): %v %s\n%s", run, args, err, rec.Outcome, stderr)
		}
		st := contiguous(t, w, rec.TargetPod)
		downtime := int64(-1)
		if rec.Downtime != nil {
			downtime = rec.Downtime.Millis
		}
		_ = out.Write([]string{strconv.Itoa(run), rec.ID, pod, kind + " " + strings.Join(variant, " "), node, to, string(rec.Outcome),
			strconv.FormatInt(rec.TotalMillis, 10), strconv.FormatInt(downtime, 10),
			strconv.FormatInt(rec.CriticalPathMillis(), 10), strconv.FormatInt(rec.OverheadMillis(), 10),
			strconv.FormatInt(holdingMillis(rec), 10), strconv.FormatUint(st.Totals.Count, 10)})
		out.Flush()
		t.Logf("run %d %s %v %s → %s: total %d ms, downtime %d ms, %d applied exactly once; %s", run, pod, variant, node, to, rec.TotalMillis, downtime, st.Totals.Count, stepSummary(rec))
		images = append(images, rec.Images...)
		if kind == "pod" {
			holding = append(holding, holdingMillis(rec))
		}
		run++
		return rec
	}
	pod, node, setNode := "consumer", "node-a", "node-a"
	for i := 0; i < runs; i++ {
		rec := migrate(w, "pod", pod, node, variants[i%len(variants)]...)
		pod, node = rec.TargetPod, otherNode[node]
		if i%5 == 4 { // the StatefulSet pod's turn
			migrate(set.w, "sts", "consumer-0", setNode, "--queue", set.w.Queue)
			setNode = otherNode[setNode]
			l.checkStatefulSetAfter(t, set, setNode)
		}
	}
	t.Logf("soak figures in %s", path)
	// A restored process carries its past (backoffs, timers): the last runs
	// may not need longer to reconnect than the first ones.
	ms := func(v []int64) float64 {
		f := make([]float64, len(v))
		for i, x := range v {
			f[i] = float64(x)
		}
		return median(f)
	}
	first, last := ms(holding[:5]), ms(holding[len(holding)-5:])
	if last > 1.2*first+200 {
		t.Errorf("the restored application needed %.0f ms to reconnect and hold in the last five runs (median), %.0f ms in the first five: it slows down run after run (%v)", last, first, holding)
	}

	checkConservation(t, w, pod)
	checkOrdinalsConserve(t, set.w)
	for ns, n := range baseline {
		pods, _ := l.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if len(pods.Items) != n {
			t.Errorf("%d pods in %s at the end, %d at the start", len(pods.Items), ns, n)
		}
	}
	l.nothingLeft(t, w)
	l.nothingLeft(t, set.w)
	records, err := report.Store{Client: l.client}.List(ctx, w.Namespace)
	setRecords, setErr := report.Store{Client: l.client}.List(ctx, set.w.Namespace)
	if err != nil || setErr != nil || len(records)+len(setRecords) != run {
		t.Errorf("%d records for %d runs (%v, %v)", len(records)+len(setRecords), run, err, setErr)
	}
	reg := image.Registry{Insecure: true}
	for _, ref := range images {
		if strings.HasPrefix(ref, "localhost:") {
			continue // a direct transfer's image never reached the registry
		}
		if _, err := reg.Pull(ctx, ref); err == nil {
			t.Errorf("checkpoint image %s left in the registry", ref)
		}
	}
}

// contiguous checks, without stopping the producer, that the consumer has
// applied every message from 1 to its last exactly once (one producer run).
func contiguous(t *testing.T, w interface {
	State(context.Context, string) (protocol.State, error)
}, pod string) protocol.State {
	t.Helper()
	st, err := w.State(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	n := st.LastSeq
	if want := protocol.SequenceDigest(st.Producer, n); st.Totals.Count != n || st.Totals.Digest != want {
		t.Fatalf("%s applied %d messages with digest %s; 1..%d exactly once would be %d with %s", pod, st.Totals.Count, st.Totals.Digest, n, n, want)
	}
	return st
}

// holdingMillis is how long the restored application took to reconnect and
// hold (the restore's "application holding" step): what a restored process
// carries from its past must not make it grow from run to run.
func holdingMillis(rec report.Record) int64 {
	p, _ := rec.Phase(report.Restore)
	for _, s := range p.Steps {
		if s.Name == report.AppHolding {
			return s.DurationMillis
		}
	}
	return -1
}
