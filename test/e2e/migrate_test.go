//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// checkConservation stops the producer, lets the consumer drain and checks
// that its applied set is exactly the producer's confirmed set.
func checkConservation(t testing.TB, w *workload.Workload, consumer string) {
	t.Helper()
	got, sent, err := w.CheckConservation(context.Background(), consumer)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("conservation: %d messages sent, %d applied exactly once (digest %s, application state %s); %d duplicates skipped",
		sent.Totals.Count, got.Totals.Count, got.Totals.Digest, got.App, got.Skipped)
}

// checkMigrated checks that the consumer now runs on node-b restored from
// its checkpoint, not restarted, and that nothing of the migration is left.
func (l *lab) checkMigrated(t testing.TB, w *workload.Workload, rec report.Record, before protocol.State) protocol.State {
	t.Helper()
	ctx := context.Background()
	if rec.Outcome != report.Succeeded {
		t.Fatalf("outcome %s: %s", rec.Outcome, rec.Error)
	}
	if _, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, "consumer", metav1.GetOptions{}); !isNotFound(err) {
		t.Fatalf("source pod still there: %v", err)
	}
	pod, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, rec.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantImage := l.registry + "/checkpoints/" + w.Namespace + "/consumer@sha256:"
	direct := len(rec.Images) > 0 && strings.HasPrefix(rec.Images[0], "localhost:")
	restoredByRuntime := runtimeRestored(pod)
	switch {
	case restoredByRuntime:
		// Its own image, by digest: the runtime restored the checkpoint
		// staged on the node, of which nothing is left, and no image was
		// made.
		wantImage = l.imagePrefix + "/ms2m-consumer@sha256:"
		if len(rec.Images) != 0 {
			t.Fatalf("a runtime restore recorded images %v", rec.Images)
		}
		l.nothingStaged(t, "node-b")
	case direct:
		// By tag: the pull of it waits for the agent to publish it.
		wantImage = fmt.Sprintf("localhost:%d/%s/consumer:consumer-%s", agent.DirectPort, w.Namespace, rec.ID)
	}
	if pod.Spec.NodeName != "node-b" || !strings.HasPrefix(pod.Spec.Containers[0].Image, wantImage) {
		t.Fatalf("target %s on %s from %s", pod.Name, pod.Spec.NodeName, pod.Spec.Containers[0].Image)
	}
	if !direct && !restoredByRuntime {
		// The process's memory leaves the registry once the target runs.
		if _, err := (image.Registry{Insecure: true}).Pull(ctx, rec.Images[0]); err == nil {
			t.Fatalf("checkpoint image %s is still in the registry", rec.Images[0])
		}
	}
	after := state(t, w, rec.TargetPod)
	// Restored, not restarted: the process identity and start time chosen at
	// the source's start survive, the state continued, and the broker
	// connection had to be re-established.
	if after.Process != before.Process || !after.StartedAt.Equal(before.StartedAt) {
		t.Fatalf("target is a new process (%s started %s), not the restored %s", after.Process, after.StartedAt, before.Process)
	}
	if after.Totals.Count < before.Totals.Count || after.Reconnects < 1 {
		t.Fatalf("state did not continue: before %+v, after %+v", before.Totals, after.Totals)
	}
	l.replayQueueGone(t, w)
	l.noAgentsLeft(t, w.Namespace)
	return after
}

func checkTimings(t testing.TB, rec report.Record) {
	t.Helper()
	for _, name := range []report.PhaseName{report.Checkpoint, report.Restore} {
		p, ok := rec.Phase(name)
		if !ok || p.DurationMillis <= 0 || p.DurationMillis > 60_000 {
			t.Fatalf("phase %s: %+v", name, p)
		}
	}
	if rec.TotalMillis <= 0 || rec.Downtime == nil || rec.Downtime.Millis < 0 || rec.Downtime.Millis > rec.TotalMillis+1000 {
		t.Fatalf("total %d ms, downtime %+v", rec.TotalMillis, rec.Downtime)
	}
}

// migrateLivePod deploys the workload at 10 msg/s, migrates the consumer to
// node-b with extra flags and checks the common outcome.
func migrateLivePod(t testing.TB, flags ...string) (*lab, *workload.Workload, report.Record) {
	return migrateLivePodAt(t, "10", flags...)
}

// migrateLivePodAt is migrateLivePod at another message rate.
func migrateLivePodAt(t testing.TB, rate string, flags ...string) (*lab, *workload.Workload, report.Record) {
	l, w, rec, _, _ := migrateLiveApp(t, workload.Options{Rate: rate}, 30, flags...)
	checkTimings(t, rec)
	return l, w, rec
}

// migrateLiveApp deploys o's workload, waits until the consumer applied
// message applied, migrates it to node-b with extra flags and checks it was
// restored there; it returns the consumer's state before and after.
func migrateLiveApp(t testing.TB, o workload.Options, applied uint64, flags ...string) (l *lab, w *workload.Workload, rec report.Record, before, after protocol.State) {
	l = setup(t)
	w = l.deployWith(t, o)
	before = waitApplied(t, w, "consumer", applied)
	rec, stderr, err := l.migrate(t, w, append([]string{"pod", "consumer", "--to", "node-b"}, flags...)...)
	if err != nil {
		t.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	after = l.checkMigrated(t, w, rec, before)
	return l, w, rec, before, after
}

func TestMS2MMigratesALivePod(t *testing.T) {
	concurrent(t)
	l, w, rec := migrateLivePod(t, "--label", "rate=10")
	if rec.Broker.ArrivalRate < 5 || rec.Broker.ArrivalRate > 15 {
		t.Errorf("λ measured %.2f msg/s, the producer sends 10", rec.Broker.ArrivalRate)
	}
	checkConservation(t, w, rec.TargetPod)

	list := l.kubectlMigrate(t, "report", "-n", w.Namespace)
	detail := l.kubectlMigrate(t, "report", "-n", w.Namespace, rec.ID)
	if !strings.Contains(list, rec.ID) || !strings.Contains(detail, "replay") || !strings.Contains(detail, "downtime") ||
		!strings.Contains(detail, "created → running") || !strings.Contains(detail, "critical path") {
		t.Fatalf("report:\n%s\n%s", list, detail)
	}
	t.Logf("report:\n%s", detail)

	// kubectl describe tells each pod's part of the story.
	for pod, want := range map[string][]string{
		"consumer":    {"MigrationPhase", "checkpoint done in", "MigrationSucceeded"},
		rec.TargetPod: {"replay done in", "MigrationSucceeded"},
	} {
		out, err := l.kubectlCommand("get", "events", "-n", w.Namespace, "--field-selector", "involvedObject.name="+pod).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl get events: %v\n%s", err, out)
		}
		for _, w := range want {
			if !strings.Contains(string(out), w) {
				t.Errorf("pod %s's Events lack %q:\n%s", pod, w, out)
			}
		}
	}
	described, err := l.kubectlCommand("describe", "pod", "-n", w.Namespace, rec.TargetPod).CombinedOutput()
	if err != nil || !strings.Contains(string(described), "MigrationSucceeded") {
		t.Errorf("kubectl describe pod %s: %v\n%s", rec.TargetPod, err, described)
	}
}

// TestDirectTransferMigratesALivePod moves the checkpoint from node to node
// with no registry: the target runs it from its own node's agent, and the
// lab's registry never saw it.
func TestDirectTransferMigratesALivePod(t *testing.T) {
	concurrent(t)
	l, w, rec := migrateLivePod(t, "--transfer", "direct")
	checkConservation(t, w, rec.TargetPod)
	if len(rec.Images) != 1 || !strings.HasPrefix(rec.Images[0], fmt.Sprintf("localhost:%d/", agent.DirectPort)) {
		t.Fatalf("images %v: not served by the target node's agent", rec.Images)
	}
	reg := image.Registry{Insecure: true}
	if _, err := reg.Pull(context.Background(), l.registry+"/checkpoints/"+w.Namespace+"/consumer:consumer-"+rec.ID); err == nil {
		t.Fatal("the checkpoint went to the registry")
	}
	if path, overhead := rec.CriticalPathMillis(), rec.OverheadMillis(); path <= 0 || overhead > path {
		t.Fatalf("critical path %d ms, overhead %d ms", path, overhead)
	}
	t.Logf("direct: critical path %d ms (ours %d ms), total %d ms, downtime %d ms", rec.CriticalPathMillis(), rec.OverheadMillis(), rec.TotalMillis, rec.Downtime.Millis)
}

func TestStopAndCopyMigratesALivePod(t *testing.T) {
	concurrent(t)
	_, w, rec := migrateLivePod(t, "--strategy", "stop-and-copy")
	if _, ok := rec.Phase(report.Replay); ok {
		t.Fatal("stop-and-copy ran a replay phase")
	}
	// Stop-and-copy's downtime spans nearly the whole migration after
	// preflight and setup (which starts the agents and pulls before
	// anything stops).
	pre, _ := rec.Phase(report.Preflight)
	ready, _ := rec.Phase(report.Setup)
	if afterSetup := rec.TotalMillis - pre.DurationMillis - ready.DurationMillis; rec.Downtime.Millis < afterSetup/2 {
		t.Errorf("stop-and-copy downtime %d ms is less than half of the %d ms from its stop to its switchover", rec.Downtime.Millis, afterSetup)
	}
	checkConservation(t, w, rec.TargetPod)
}

// TestFailedMigrationRollsBack makes replay time out (the target cannot
// catch up in 1 ms) after checkpoint, image and restore have changed the
// cluster: everything must be undone and the source must keep serving.
func TestFailedMigrationRollsBack(t *testing.T) {
	concurrent(t)
	failedMigrationRollsBack(t, setup(t))
}

// failedMigrationRollsBack is TestFailedMigrationRollsBack with flags.
func failedMigrationRollsBack(t *testing.T, l *lab, flags ...string) *workload.Workload {
	w := l.deploy(t, "10")
	before := waitApplied(t, w, "consumer", 20)
	rec, stderr, err := l.migrate(t, w, append([]string{"pod", "consumer", "--to", "node-b", "--replay-timeout", "1ms"}, flags...)...)
	if err == nil {
		t.Fatal("migration succeeded with a 1 ms replay timeout")
	}
	if rec.Outcome != report.RolledBack || !strings.Contains(stderr, "rolling back") {
		t.Fatalf("outcome %s\n%s", rec.Outcome, stderr)
	}
	ctx := context.Background()
	pods, err := l.client.CoreV1().Pods(w.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Name != "consumer" && p.Name != "producer" {
			t.Fatalf("pod %s left after rollback", p.Name)
		}
	}
	st := state(t, w, "consumer")
	if st.Mode != protocol.ModePrimary || st.PendingRestore || st.Process != before.Process {
		t.Fatalf("source not serving after rollback: %+v", st)
	}
	waitApplied(t, w, "consumer", st.LastSeq+5) // it keeps applying
	l.replayQueueGone(t, w)
	checkConservation(t, w, "consumer")
	return w
}

// TestThresholdCutoff migrates at 16 msg/s, close to the consumer's μ ≈ 20/s,
// once without and once with the threshold cutoff: with it the replay stays
// within T_replay_max (plus a margin for polling and the switch), and the
// migration ends sooner; both conserve every message.
func TestThresholdCutoff(t *testing.T) {
	// T_cutoff = T_replay_max·μ/λ ≈ 5 s after the bind should outlast
	// checkpoint, transfer and restore (≈ 2 s here), since μ is measured on
	// the target's replay (on a loaded machine it fires as replay starts),
	// and fall well inside the ≈ 8 s the replay takes without a cutoff.
	const replayMax = 4 * time.Second
	wPlain, plain := plainAt16(t)
	checkConservation(t, wPlain, plain.TargetPod)
	_, wCut, cut := migrateLivePodAt(t, "16", "--label", "rate=16", "--replay-max", replayMax.String())
	checkConservation(t, wCut, cut.TargetPod)

	c := cut.Cutoff
	if c == nil || !c.Fired {
		t.Fatalf("cutoff did not fire: %+v", c)
	}
	if c.ArrivalRate < 12 || c.ArrivalRate > 20 || c.ServiceRate < 14 || c.ServiceRate > 24 {
		t.Errorf("measured λ %.1f/s and μ %.1f/s; expected about 16 and 20", c.ArrivalRate, c.ServiceRate)
	}
	const margin = 3 * time.Second
	if time.Duration(c.ReplayMillis)*time.Millisecond > replayMax+margin {
		t.Errorf("replay took %d ms with T_replay_max %s", c.ReplayMillis, replayMax)
	}
	if cut.TotalMillis >= plain.TotalMillis {
		t.Errorf("with cutoff %d ms, without %d ms: the cutoff did not shorten the migration", cut.TotalMillis, plain.TotalMillis)
	}
	t.Logf("at 16 msg/s: total %d ms without cutoff, %d ms with (T_cutoff %d ms, fired after %d ms, replay %d ms); downtime %d vs %d ms",
		plain.TotalMillis, cut.TotalMillis, c.CutoffMillis, c.FiredAfterMillis, c.ReplayMillis, plain.Downtime.Millis, cut.Downtime.Millis)
}

// plainAt16 is TestThresholdCutoff's baseline, MS2M at 16 msg/s without a
// cutoff. μ ≈ 20/s leaves little room: when the shared machine slows the
// target to λ, the migration rightly rolls back, early, naming
// --replay-max; that rollback must keep every message, and the baseline is
// taken once more on a fresh workload. Any other failure, or a second
// rollback, fails the test.
func plainAt16(t *testing.T) (*workload.Workload, report.Record) {
	l := setup(t)
	for attempt := 1; ; attempt++ {
		w := l.deploy(t, "16")
		before := waitApplied(t, w, "consumer", 30)
		rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--label", "rate=16")
		if err != nil && attempt == 1 && rec.Outcome == report.RolledBack && strings.Contains(rec.Error, "--replay-max") {
			checkConservation(t, w, "consumer")
			t.Logf("the baseline rolled back (%s); once more", rec.Error)
			continue
		}
		if err != nil {
			t.Fatalf("migration failed: %v\n%s", err, stderr)
		}
		l.checkMigrated(t, w, rec, before)
		checkTimings(t, rec)
		return w, rec
	}
}

// TestReplayThatCannotCatchUpEndsEarly: at 24 msg/s a consumer taking 50 ms
// per message (μ ≈ 20/s) never catches up. Without --replay-max the
// migration says so within seconds of replay, naming the fix, instead of
// replaying until --replay-timeout; it rolls back and the source serves on.
func TestReplayThatCannotCatchUpEndsEarly(t *testing.T) {
	l := setup(t)
	w := l.deploy(t, "24")
	waitApplied(t, w, "consumer", 20)
	t0 := time.Now()
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--replay-timeout", "2m")
	if err == nil {
		t.Fatal("a replay that cannot catch up succeeded")
	}
	if rec.Outcome != report.RolledBack || !strings.Contains(stderr, "cannot catch up") || !strings.Contains(stderr, "--replay-max") {
		t.Fatalf("outcome %s\n%s", rec.Outcome, stderr)
	}
	if p, _ := rec.Phase(report.Replay); p.DurationMillis > 30_000 {
		t.Errorf("replay ran %d ms before giving up", p.DurationMillis)
	}
	t.Logf("gave up after %s (replay %d ms)", time.Since(t0).Round(time.Second), func() int64 { p, _ := rec.Phase(report.Replay); return p.DurationMillis }())
	if st := state(t, w, "consumer"); st.Mode != protocol.ModePrimary {
		t.Fatalf("source not serving after rollback: %+v", st)
	}
	checkConservation(t, w, "consumer")
}

// TestDryRunPredicts: a first migration of a consumer at 10 msg/s predicts
// itself with λ near 10 and μ from the application's service time, and
// keeps the prediction; a server dry run of the next one (back to node-a) measures
// λ near 10, takes μ from the first, and predicts replay, total and
// downtime; it changes nothing and the consumer loses nothing.
func TestDryRunPredicts(t *testing.T) {
	l := setup(t)
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 20)
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b")
	if err != nil {
		t.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	if p := rec.Prediction; p == nil || p.MuFrom != report.MuFromApplication || p.Mu < 15 || p.Mu > 21 || p.Lambda < 6 || p.Lambda > 14 || p.TotalMillis == 0 {
		t.Fatalf("the migration kept no sound prediction: %+v", p)
	} else {
		t.Logf("predicted total %d ms (took %d ms), replay %d ms (took %d ms)", p.TotalMillis, rec.TotalMillis, p.ReplayMillis, func() int64 { ph, _ := rec.Phase(report.Replay); return ph.DurationMillis }())
	}
	before := state(t, w, rec.TargetPod)
	out := l.kubectlMigrate(t, "-n", w.Namespace, "pod", rec.TargetPod, "--to", "node-a", "--dry-run=server", "--allow-anonymous-checkpoints",
		"--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab", "--insecure-registry")
	t.Logf("dry run:\n%s", out)
	m := regexp.MustCompile(`λ ([0-9.]+) msg/s, μ ([0-9.]+) msg/s`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "recent migration(s) on this cluster") || !strings.Contains(out, "(from earlier migrations)") || !strings.Contains(out, "replay ≈ backlog / (μ − λ)") {
		t.Fatalf("no prediction from the earlier migration in:\n%s", out)
	}
	lambda, _ := strconv.ParseFloat(m[1], 64)
	mu, _ := strconv.ParseFloat(m[2], 64)
	if lambda < 6 || lambda > 14 || mu <= lambda {
		t.Fatalf("λ %.1f (producer at 10/s), μ %.1f", lambda, mu)
	}
	if st := state(t, w, rec.TargetPod); st.Mode != protocol.ModePrimary || st.Process != before.Process {
		t.Fatalf("the dry run disturbed the consumer: %+v", st)
	}
	checkConservation(t, w, rec.TargetPod)
}
