//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestStatefulSetRollbackAfterReplay fails sequential mode once the copy on
// node-b has replayed everything the source had applied (and acknowledged it
// from the replay queue): the copy's state must move back, not the stale
// checkpoint, or the replayed messages are lost.
func TestStatefulSetRollbackAfterReplay(t *testing.T) {
	concurrent(t)
	rollBackStatefulSet(t, "--inject-failure", "replay")
}

// TestPodRollbackAfterReplay fails a pod's MS2M migration after its replay:
// the source kept serving, the target is removed, nothing is lost.
func TestPodRollbackAfterReplay(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deploy(t, "10")
	before := waitApplied(t, w, "consumer", 20)
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--inject-failure", "replay")
	if err == nil || rec.Outcome != report.RolledBack {
		t.Fatalf("want a rolled-back migration, got %v %s\n%s", err, rec.Outcome, stderr)
	}
	if st := state(t, w, "consumer"); st.Mode != protocol.ModePrimary || st.Process != before.Process {
		t.Fatalf("source not serving after rollback: %+v", st)
	}
	checkConservation(t, w, "consumer")
	l.nothingLeft(t, w, rec.TargetPod)
}

// TestSecondMigrationRefused starts a migration and, while it runs, another
// of the same pod and one of another ordinal of the same StatefulSet: both
// are refused before they change anything, naming the running migration.
func TestSecondMigrationRefused(t *testing.T) {
	concurrent(t)
	t.Run("pod", func(t *testing.T) {
		l := setup(t)
		w := l.deploy(t, "10")
		waitApplied(t, w, "consumer", 20)
		first, out := l.start(t, w, "pod", "consumer", "--to", "node-b")
		id := l.waitLease(t, w, lease.Name("pod", "consumer"))
		_, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--strategy", "stop-and-copy")
		if err == nil || !strings.Contains(stderr, "pod consumer is being migrated by migration "+id) {
			t.Fatalf("the second migration was not refused: %v\n%s", err, stderr)
		}
		if err := first.Wait(); err != nil {
			t.Fatalf("the first migration failed: %v\n%s", err, out)
		}
		rec := l.onlyRecord(t, w)
		if rec.Outcome != report.Succeeded {
			t.Fatalf("first migration %s", rec.Outcome)
		}
		checkConservation(t, w, rec.TargetPod)
		l.nothingLeft(t, w, "consumer")
	})
	t.Run("statefulset", func(t *testing.T) {
		l := setup(t)
		b := l.startStatefulSet(t, 20)
		first, out := l.start(t, b.w, "sts", "consumer-0", "--to", "node-b", "--queue", b.w.Queue)
		id := l.waitLease(t, b.w, lease.Name("sts", "consumer"))
		_, stderr, err := l.migrate(t, b.w, "sts", "consumer-1", "--to", "node-b", "--queue", queueOfOrdinal(b.w, 1))
		if err == nil || !strings.Contains(stderr, "StatefulSet consumer is being migrated by migration "+id) {
			t.Fatalf("the other ordinal's migration was not refused: %v\n%s", err, stderr)
		}
		if err := first.Wait(); err != nil {
			t.Fatalf("the first migration failed: %v\n%s", err, out)
		}
		l.checkStatefulSetAfter(t, b, "node-b")
		checkConservation(t, b.w, "consumer-0")
		l.nothingLeft(t, b.w)
	})
}

// queueOfOrdinal is the queue of another ordinal than the workload's.
func queueOfOrdinal(w *workload.Workload, ordinal int) string {
	return strings.TrimSuffix(w.Queue, "-0") + "-" + strconv.Itoa(ordinal)
}

// waitLease waits until the lease exists and returns its holder.
func (l *lab) waitLease(t *testing.T, w *workload.Workload, name string) string {
	t.Helper()
	var holder string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		lease, err := l.client.CoordinationV1().Leases(w.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *lease.Spec.HolderIdentity
		return true, nil
	})
	if err != nil {
		t.Fatalf("lease %s never taken: %v", name, err)
	}
	return holder
}

// TestPreflightRefusesBeforeAnyChange: an agent image the nodes cannot pull
// and an invalid target name are refused with one line naming the fix, and
// nothing is changed.
func TestPreflightRefusesBeforeAnyChange(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deploy(t, "10")
	before := waitApplied(t, w, "consumer", 10)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--agent-image", l.registry + "/nope/kubectl-migrate-agent:missing"}, "cannot run the agent image"},
		{[]string{"--target-name", "Bad_Name"}, `--target-name "Bad_Name" is not a valid pod name`},
	} {
		_, stderr, err := l.migrate(t, w, append([]string{"pod", "consumer", "--to", "node-b"}, tc.args...)...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		if err == nil || !strings.Contains(lines[len(lines)-1], tc.want) || !strings.Contains(lines[len(lines)-1], "--") {
			t.Fatalf("want one error line with %q naming a flag, got %v:\n%s", tc.want, err, stderr)
		}
		records, _ := report.Store{Client: l.client}.List(context.Background(), w.Namespace)
		if len(records) != 0 {
			t.Fatalf("a refused migration left a record")
		}
		if st := state(t, w, "consumer"); st.Mode != protocol.ModePrimary || st.PendingRestore || st.Process != before.Process {
			t.Fatalf("the source was disturbed: %+v", st)
		}
		l.nothingLeft(t, w)
	}
	checkConservation(t, w, "consumer")
}

// TestRestartAfterMigration kills the restored consumer's process after a
// successful migration: the kubelet restarts the container, the runtime
// restores it from its checkpoint image again, and it must serve again
// within a bound (not hold forever), saying so in its state. Messages it
// applied between the checkpoint and its death are gone from its memory, as
// with any crash of an in-memory consumer; so there is no conservation check.
func TestRestartAfterMigration(t *testing.T) {
	concurrent(t)
	l, w, rec := migrateLivePod(t)
	st := restartsFromItsCheckpoint(t, l, w, rec)
	waitApplied(t, w, rec.TargetPod, st.LastSeq+5) // it applies new messages
}

// restartsFromItsCheckpoint kills rec's restored consumer and checks that
// the kubelet restarts it, restored from its checkpoint image again, and
// that it serves and becomes Ready; it returns the state it serves with.
func restartsFromItsCheckpoint(t *testing.T, l *lab, w *workload.Workload, rec report.Record) protocol.State {
	t.Helper()
	ctx := context.Background()
	pod, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, rec.TargetPod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pid := containerProcess(t, string(pod.UID), "ms2m-consumer")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	const bound = 60 * time.Second
	var st protocol.State
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, bound, true, func(ctx context.Context) (bool, error) {
		p, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, rec.TargetPod, metav1.GetOptions{})
		// The kubelet has seen the kill once it counts a restart or shows
		// the last termination: CRI-O's restored container carries the
		// checkpointed one's attempt number (the count stays 0); the
		// containerd lane's may count 1 with no last state.
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false, nil
		}
		if cs := p.Status.ContainerStatuses[0]; cs.RestartCount == 0 && cs.LastTerminationState.Terminated == nil {
			return false, nil
		}
		st, err = w.State(ctx, rec.TargetPod)
		return err == nil && st.Mode == protocol.ModePrimary && st.RestoredAgain == 1, nil
	})
	if err != nil {
		t.Fatalf("the restarted consumer does not serve within %s: %+v (%v)", bound, st, err)
	}
	t.Logf("restored again and serving %s after the kill", time.Since(killed).Round(100*time.Millisecond))
	ready := func(ctx context.Context) (bool, error) {
		p, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, rec.TargetPod, metav1.GetOptions{})
		return err == nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready, nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, ready); err != nil {
		t.Fatal("the restarted consumer never became Ready: its probes did not follow it")
	}
	return st
}

// containerProcess finds the process named comm in the pod with uid (the
// lab's nodes share this machine's process table).
func containerProcess(t *testing.T, uid, comm string) int {
	t.Helper()
	for _, pid := range podProcesses(uid) {
		if name, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm")); strings.TrimSpace(string(name)) == comm {
			return pid
		}
	}
	t.Fatalf("no process %s in pod %s", comm, uid)
	return 0
}

// podProcesses are the processes in the cgroups of the pod with uid (the
// lab's nodes share this machine's process table).
func podProcesses(uid string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cgroup, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if strings.Contains(string(cgroup), uid) || strings.Contains(string(cgroup), strings.ReplaceAll(uid, "-", "_")) {
			pids = append(pids, pid)
		}
	}
	return pids
}
