//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kubelet"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// The world fails from outside the plugin, each fault at its worst moment;
// every case ends with conservation and nothing left behind.

// labDaemons returns what stops or starts one of the lab's daemons (go run
// ./test/lab stop|start NAME), through a lab binary built beforehand so the
// fault lands within milliseconds. A stopped daemon is started again when
// the test ends, whatever it did.
func labDaemons(t *testing.T) func(verb, name string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "lab")
	build := exec.Command("go", "build", "-o", bin, "github.com/kubectl-migrate/kubectl-migrate/test/lab")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the lab: %v\n%s", err, out)
	}
	run := func(verb, name string) error {
		cmd := exec.Command(bin, verb, name)
		cmd.Dir = "../.." // the lab runs from the repository's root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("lab %s %s: %v\n%s", verb, name, err, out)
		}
		return err
	}
	return func(verb, name string) {
		t.Helper()
		if verb == "stop" {
			t.Cleanup(func() { _ = run("start", name) })
		}
		if err := run(verb, name); err != nil {
			t.Fatal(err)
		}
	}
}

// whenPhase waits until the migration running in w's namespace records
// phase as running (its journal is saved as each phase starts).
func (l *lab) whenPhase(t *testing.T, w *workload.Workload, phase report.PhaseName, out *bytes.Buffer) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		records, err := report.Store{Client: l.client}.List(ctx, w.Namespace)
		if err != nil || len(records) != 1 {
			return false, nil
		}
		for _, p := range records[0].Phases {
			if p.Name == phase && p.Running {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("phase %s never ran: %v\n%s", phase, err, out)
	}
}

// whenOutput waits until the plugin has printed text.
func whenOutput(t *testing.T, out *bytes.Buffer, text string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		return strings.Contains(out.String(), text), nil
	})
	if err != nil {
		t.Fatalf("the plugin never printed %q:\n%s", text, out)
	}
}

// finished waits for the plugin and returns the migration's record.
func (l *lab) finished(t *testing.T, w *workload.Workload, cmd *exec.Cmd, out *bytes.Buffer) (report.Record, error) {
	t.Helper()
	err := cmd.Wait()
	t.Logf("kubectl migrate ended (%v):\n%s", err, out)
	return *l.onlyRecord(t, w), err
}

// rolledBackServing checks that a migration rolled back, the source serves
// as the same process, nothing is lost and nothing is left.
func (l *lab) rolledBackServing(t *testing.T, w *workload.Workload, rec report.Record, before protocol.State) {
	t.Helper()
	if rec.Outcome != report.RolledBack {
		t.Fatalf("outcome %q, want rolled-back", rec.Outcome)
	}
	st := waitApplied(t, w, "consumer", state(t, w, "consumer").LastSeq+5) // it keeps applying
	if st.Mode != protocol.ModePrimary || st.Process != before.Process {
		t.Fatalf("source not serving after rollback: %+v", st)
	}
	checkConservation(t, w, "consumer")
	var targets []string
	if rec.TargetPod != "" {
		targets = append(targets, rec.TargetPod)
	}
	l.nothingLeft(t, w, targets...)
}

// TestFaultRegistryGoneBeforeThePush: the registry stops once preflight
// checked it and the agents run (they pulled their image), so the push
// fails; the migration rolls back.
func TestFaultRegistryGoneBeforeThePush(t *testing.T) {
	l := setup(t)
	daemon := labDaemons(t)
	w := l.deployWith(t, workload.Options{Rate: "10", Ballast: "64Mi"}) // a checkpoint that takes a moment
	before := waitApplied(t, w, "consumer", 20)
	cmd, out := l.start(t, w, "pod", "consumer", "--to", "node-b")
	whenOutput(t, out, "agents ok")
	daemon("stop", "registry")
	rec, err := l.finished(t, w, cmd, out)
	if err == nil {
		t.Fatal("the migration succeeded without its registry")
	}
	daemon("start", "registry")
	if p, _ := rec.Phase(report.Image); p.Error == "" {
		t.Fatalf("the push did not fail: %+v", rec.Phases)
	}
	l.rolledBackServing(t, w, rec, before)
}

// TestFaultRegistryGoneWhileTheTargetPulls: the registry stops as restore
// starts; the target node cannot pull the checkpoint and the migration rolls
// back; the pushed image, which the registry could not delete, is named in
// the record.
func TestFaultRegistryGoneWhileTheTargetPulls(t *testing.T) {
	l := setup(t)
	daemon := labDaemons(t)
	w := l.deploy(t, "10")
	before := waitApplied(t, w, "consumer", 20)
	cmd, out := l.start(t, w, "pod", "consumer", "--to", "node-b", "--phase-timeout", "1m")
	l.whenPhase(t, w, report.Restore, out)
	daemon("stop", "registry")
	rec, err := l.finished(t, w, cmd, out)
	if err == nil {
		t.Fatal("the migration succeeded while its registry was gone")
	}
	daemon("start", "registry")
	if len(rec.Leftovers) != 1 || !strings.Contains(rec.Leftovers[0], rec.Images[0]) {
		t.Fatalf("leftovers %v, images %v", rec.Leftovers, rec.Images)
	}
	l.rolledBackServing(t, w, rec, before)
}

// faultDuringReplay migrates a live consumer at 16 msg/s (a longer replay),
// does fault to the restored pod as replay runs, and requires the migration
// to roll back with the source serving and nothing lost or left.
func faultDuringReplay(t *testing.T, fault func(l *lab, target *corev1.Pod)) {
	l := setup(t)
	w := l.deploy(t, "16")
	before := waitApplied(t, w, "consumer", 20)
	cmd, out := l.start(t, w, "pod", "consumer", "--to", "node-b")
	l.whenPhase(t, w, report.Replay, out)
	rec := l.onlyRecord(t, w)
	target, err := l.client.CoreV1().Pods(w.Namespace).Get(context.Background(), rec.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fault(l, target)
	final, err := l.finished(t, w, cmd, out)
	if err == nil {
		t.Fatal("the migration succeeded although its target failed during replay")
	}
	l.rolledBackServing(t, w, final, before)
}

// TestFaultTargetDeletedDuringReplay: someone deletes the restored pod while
// it replays; the migration rolls back and the source never stopped.
func TestFaultTargetDeletedDuringReplay(t *testing.T) {
	concurrent(t)
	faultDuringReplay(t, func(l *lab, target *corev1.Pod) {
		if err := l.client.CoreV1().Pods(target.Namespace).Delete(context.Background(), target.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFaultTargetKilledDuringReplay: the restored process dies while it
// replays; its container comes back from the checkpoint, holding, and no
// longer gains on the source: the migration rolls back.
func TestFaultTargetKilledDuringReplay(t *testing.T) {
	concurrent(t)
	faultDuringReplay(t, func(_ *lab, target *corev1.Pod) {
		if err := syscall.Kill(containerProcess(t, string(target.UID), "ms2m-consumer"), syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFaultSourceKilledBeforeTheSwitchover: the source's process dies after
// the checkpoint (during restore) and its container starts afresh. The
// restored copy holds everything up to the checkpoint and the replay queue
// everything after it, so the migration completes and nothing is lost.
func TestFaultSourceKilledBeforeTheSwitchover(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 20)
	cmd, out := l.start(t, w, "pod", "consumer", "--to", "node-b")
	l.whenPhase(t, w, report.Restore, out)
	source, err := l.client.CoreV1().Pods(w.Namespace).Get(context.Background(), "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(containerProcess(t, string(source.UID), "ms2m-consumer"), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	rec, err := l.finished(t, w, cmd, out)
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("outcome %q: %v", rec.Outcome, err)
	}
	checkConservation(t, w, rec.TargetPod)
	l.nothingLeft(t, w, "consumer")
}

// TestFaultBrokerRestartedDuringReplay: RabbitMQ restarts while the target
// replays (durable queues, persistent messages). The plugin, the producer
// and both instances reconnect; the migration completes or rolls back, and
// either way nothing is lost or applied twice.
func TestFaultBrokerRestartedDuringReplay(t *testing.T) {
	if os.Getenv("E2E_SLOW_FAULTS") == "" {
		t.Skip("a broker restart takes its time: make slow-faults runs it (E2E_SLOW_FAULTS=1)")
	}
	outageDuring(t, workload.Options{Rate: "16"}, report.Replay, "rabbitmq", 0)
}

// TestFaultBrokerRestartedDuringSwitchover: RabbitMQ restarts while the
// target takes over. At 24 msg/s and 100 ms per message (λ > μ = 10/s)
// with --replay-max the switchover is long: the source is stopped at the
// cutoff and the target replays the backlog up to the source's last message
// before it takes the primary queue, seconds that the restart falls into.
// The migration is committed by then: it must complete, with nothing lost
// or applied twice.
func TestFaultBrokerRestartedDuringSwitchover(t *testing.T) {
	if os.Getenv("E2E_SLOW_FAULTS") == "" {
		t.Skip("a broker restart takes its time: make slow-faults runs it (E2E_SLOW_FAULTS=1)")
	}
	if rec := outageDuring(t, workload.Options{Rate: "24", Work: "100ms"}, report.Switchover, "rabbitmq", 0, "--replay-max", "2s"); rec.Outcome != report.Succeeded {
		t.Fatalf("a broker restart during the switchover made the migration %s", rec.Outcome)
	}
}

// outageDuring migrates the consumer of a workload (with flags), stops a lab
// daemon as phase starts, brings it back after outage, and requires the
// migration to end either way with nothing lost or applied twice and
// nothing left.
func outageDuring(t *testing.T, o workload.Options, phase report.PhaseName, daemonName string, outage time.Duration, flags ...string) report.Record {
	l := setup(t)
	daemon := labDaemons(t)
	w := l.deployWith(t, o)
	waitApplied(t, w, "consumer", 20)
	cmd, out := l.start(t, w, append([]string{"pod", "consumer", "--to", "node-b"}, flags...)...)
	l.whenPhase(t, w, phase, out)
	daemon("stop", daemonName)
	down := time.Now()
	time.Sleep(outage) // the outage itself, not a wait for anything
	daemon("start", daemonName)
	rec, err := l.finished(t, w, cmd, out)
	if p, ok := rec.Phase(phase); !ok || rec.StartedAt.Add(time.Duration(p.StartMillis+p.DurationMillis)*time.Millisecond).Before(down) {
		t.Fatalf("%s was down only after %s had ended (%+v): the fault missed its moment", daemonName, phase, p)
	} else {
		t.Logf("%s down %s into %s", daemonName, down.Sub(rec.StartedAt.Add(time.Duration(p.StartMillis)*time.Millisecond)).Round(time.Millisecond), phase)
	}
	switch rec.Outcome {
	case report.Succeeded:
		checkConservation(t, w, rec.TargetPod)
		l.nothingLeft(t, w, "consumer")
	case report.RolledBack:
		checkConservation(t, w, "consumer")
		l.nothingLeft(t, w, rec.TargetPod)
	default:
		t.Fatalf("outcome %q: %v", rec.Outcome, err)
	}
	return rec
}

// TestFaultAPIServerRestartedDuringRestore: the API server is away for 3 s
// while the target is restored. The plugin's watch and its journal saves
// ride it out: the migration completes. The kubelets' and the plugin's
// watches come back only after their backoff, so the restore takes about
// 30 s and the replay queue holds some 300 messages: the consumer takes
// 20 ms a message (μ ≈ 50/s) to replay them in seconds, not half a minute.
func TestFaultAPIServerRestartedDuringRestore(t *testing.T) {
	if rec := outageDuring(t, workload.Options{Rate: "10", Work: "20ms"}, report.Restore, "kube-apiserver", 3*time.Second); rec.Outcome != report.Succeeded {
		t.Fatalf("an API server restart of 3 s made the migration %s", rec.Outcome)
	}
}

// TestFaultTargetKubeletStoppedDuringRestore: the target node's kubelet is
// away for 3 s as the restored pod is created; it starts the pod once back,
// within the phase's time: the migration completes.
func TestFaultTargetKubeletStoppedDuringRestore(t *testing.T) {
	if rec := outageDuring(t, workload.Options{Rate: "10"}, report.Restore, "node-b-kubelet", 3*time.Second); rec.Outcome != report.Succeeded {
		t.Fatalf("a kubelet restart of 3 s made the migration %s", rec.Outcome)
	}
}

// TestFaultTargetKubeletGoneDuringRestore: the target node's kubelet stops
// as the restore starts and stays away. The pod cannot start there: the
// migration rolls back once the kubelet has not answered for
// --kubelet-timeout, not after the phase's three minutes. The source never
// stopped; when the kubelet returns, nothing of the copy comes back.
func TestFaultTargetKubeletGoneDuringRestore(t *testing.T) {
	l := setup(t)
	l.targetKubeletGone(t, func(w *workload.Workload, out *bytes.Buffer) { l.whenPhase(t, w, report.Restore, out) })
}

// TestFaultTargetKubeletGoneWithTheCopyRunning: the target's kubelet stops
// once the restored pod has its sandbox (an address), and the migration
// fails later (--inject-failure replay). A graceful delete of the copy would
// wait for that kubelet forever: the target node's agent stops the pod's
// sandbox through the runtime, which ends the copy's processes, and the pod
// is deleted at once.
func TestFaultTargetKubeletGoneWithTheCopyRunning(t *testing.T) {
	l := setup(t)
	out := l.targetKubeletGone(t, func(_ *workload.Workload, out *bytes.Buffer) {
		whenOutput(t, out, "pod has an address")
	}, "--inject-failure", "replay")
	if !strings.Contains(out, "stopped 1 sandbox(es)") {
		t.Fatalf("the copy's sandbox was not stopped through the runtime:\n%s", out)
	}
}

// targetKubeletGone migrates a consumer to node-b, stops node-b's kubelet
// once when has seen its moment, and requires a rollback within
// --kubelet-timeout (5 s) of the kubelet going, with the source serving,
// conservation, nothing left and no process of the copy running, then and
// once the kubelet is back. It returns the plugin's output.
func (l *lab) targetKubeletGone(t *testing.T, when func(*workload.Workload, *bytes.Buffer), flags ...string) string {
	t.Helper()
	daemon := labDaemons(t)
	w := l.deploy(t, "10")
	before := waitApplied(t, w, "consumer", 20)
	cmd, out := l.start(t, w, append([]string{"pod", "consumer", "--to", "node-b", "--kubelet-timeout", "5s"}, flags...)...)
	when(w, out)
	daemon("stop", "node-b-kubelet")
	down := time.Now()
	target := l.onlyRecord(t, w).TargetPod
	var uid string
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pod, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, target, metav1.GetOptions{})
		if err == nil {
			uid = string(pod.UID)
		}
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the target pod %s was never created: %v\n%s", target, err, out)
	}
	rec, err := l.finished(t, w, cmd, out)
	if err == nil {
		t.Fatal("the migration succeeded onto a node whose kubelet was gone")
	}
	if took := time.Since(down); took > time.Minute {
		t.Fatalf("the migration ended %s after the kubelet went: it waited for a timeout other than --kubelet-timeout", took.Round(time.Second))
	} else {
		t.Logf("rolled back %s after the kubelet went", took.Round(time.Millisecond))
	}
	if !strings.Contains(out.String(), "the kubelet on node-b does not answer") {
		t.Fatalf("the plugin never said that the kubelet does not answer:\n%s", out)
	}
	l.rolledBackServing(t, w, rec, before)
	if pids := podProcesses(uid); len(pids) != 0 {
		t.Fatalf("processes of the restored pod still run: %v", pids)
	}
	daemon("start", "node-b-kubelet")
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return (kubelet.Client{REST: l.client.CoreV1().RESTClient()}).Healthy(ctx, "node-b") == nil, nil
	}); err != nil {
		t.Fatalf("the kubelet on node-b did not come back: %v", err)
	}
	if _, err := l.client.CoreV1().Pods(w.Namespace).Get(context.Background(), target, metav1.GetOptions{}); !isNotFound(err) {
		t.Fatalf("pod %s is back with its kubelet: %v", target, err)
	}
	if pids := podProcesses(uid); len(pids) != 0 {
		t.Fatalf("processes of the restored pod run again with the kubelet back: %v", pids)
	}
	checkConservation(t, w, "consumer")
	return out.String()
}

// TestFaultProducerRestartedAfterMigration: after a migration the producer
// restarts and numbers its messages from 1 again. The migrated consumer must
// apply the new run's messages (not skip them as below its last sequence),
// and migrate back with both runs in its state: nothing lost, nothing twice.
func TestFaultProducerRestartedAfterMigration(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deploy(t, "10")
	before := waitApplied(t, w, "consumer", 20)
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b")
	if err != nil {
		t.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	l.checkMigrated(t, w, rec, before)
	first, err := w.RestartProducer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Past the first run's last sequence: every one of these would have been
	// skipped by a consumer comparing sequences alone.
	st := waitApplied(t, w, rec.TargetPod, first.LastSeq+10)
	if st.Producer == first.Producer || len(st.RetiredProducers) == 0 || st.RetiredProducers[len(st.RetiredProducers)-1] != first.Producer {
		t.Fatalf("the consumer did not take the producer's new run: producer %q, retired %v (first run %q)", st.Producer, st.RetiredProducers, first.Producer)
	}
	back, stderr, err := l.migrate(t, w, "pod", rec.TargetPod, "--to", "node-a")
	if err != nil || back.Outcome != report.Succeeded {
		t.Fatalf("migration back failed: %v\n%s", err, stderr)
	}
	checkConservation(t, w, back.TargetPod)
	l.nothingLeft(t, w, rec.TargetPod)
}
