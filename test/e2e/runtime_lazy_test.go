//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// This file's name puts its tests, in go test's order (files by name),
// right before runtime_test.go's: the serial tests that need the runtime
// follow one another and share one installation.

// lazyConsumer is a consumer holding 512 MiB that checks them every
// second (ending if a byte changed), under the kubectl-migrate runtime.
var lazyConsumer = workload.Options{Rate: "10", Ballast: "512Mi", VerifyBallast: "1s", RuntimeClass: ociruntime.HandlerName}

// TestLazyPages sets the runtime up with node-setup (not beside the
// concurrent tests: their migrations would take it), and:
//
//   - moves a consumer holding 512 MiB with --pages lazy, stop-and-copy
//     and MS2M: its pages stay in the frozen source while the copy runs on
//     the target (with MS2M, replaying), and follow over the agents'
//     stream; the migration switches over only once the last page arrived
//     (a step of the report). Every message is
//     applied exactly once, the copy is the same process, and its memory
//     checks out whole after the move (it recomputes the ballast's checksum
//     every second, and ends if one byte changed);
//   - kills the restored copy while its pages still arrive: the migration
//     rolls back, the source (frozen until then, never killed) resumes as
//     the same process with its memory whole, and every message is applied
//     exactly once: the kubelet's restart of the dead copy does not start
//     it afresh, which would take the queue's messages from the source.
func TestLazyPages(t *testing.T) {
	l := setupUnderRuntime(t)
	for _, tc := range []struct {
		strategy string
		lastPage report.PhaseName // the phase that waits for it
	}{
		{"stop-and-copy", report.Restore},
		// MS2M's copy replays while its pages arrive.
		{"ms2m", report.Replay},
	} {
		t.Run(tc.strategy+"/512MiB", func(t *testing.T) {
			_, w, rec, _, _ := migrateLiveApp(t, lazyConsumer, 20, "--strategy", tc.strategy, "--pages", "lazy")
			checkConservation(t, w, rec.TargetPod)
			ph, _ := rec.Phase(tc.lastPage)
			var lastPage time.Duration
			for _, s := range ph.Steps {
				if s.Name == report.LastPage {
					lastPage = time.Duration(s.DurationMillis) * time.Millisecond
				}
			}
			if lastPage == 0 {
				t.Fatalf("no %q step in the %s: %+v", report.LastPage, tc.lastPage, ph.Steps)
			}
			checked := l.ballastChecksAfter(t, w.Namespace, rec.TargetPod, 2)
			t.Logf("lazy pages, %s, 512 MiB: downtime %d ms, critical path %d ms, last page %s after the copy ran; %s",
				tc.strategy, rec.Downtime.Millis, rec.CriticalPathMillis(), lastPage, checked)
		})
		t.Run(tc.strategy+"/rollback/copy-killed-during-the-push", func(t *testing.T) { lazyRollBackWhenTheCopyDies(t, l, tc.strategy) })
	}
}

// TestRecoverLazyPagesAfterCrash kills the plugin at a step of a lazy MS2M
// and a lazy stop-and-copy move, while the pages travel, and recovers it:
// before the last page the source runs again with every message, after
// the switchover the copy serves; conservation either way. With
// E2E_CRASH_MATRIX naming lazy (make crash-matrix), at every step of both.
// One at a time: a lazy move receives on both nodes' ports, which moves
// take in turns.
func TestRecoverLazyPagesAfterCrash(t *testing.T) {
	l := setupUnderRuntime(t)
	chosen := []crashCase{
		{name: "ms2m/replay", args: []string{"--inject-crash", "replay"}, want: report.RolledBack},
		{name: "stop-and-copy/restore", args: []string{"--strategy", "stop-and-copy", "--inject-crash", "restore"}, want: report.RolledBack},
	}
	cases := chosen
	if slices.Contains(strings.Split(os.Getenv("E2E_CRASH_MATRIX"), ","), "lazy") {
		cases = everyStep(nil, contractPod, true)
	}
	small := lazyConsumer
	small.Ballast = "64Mi" // the path is the same; the runs are quicker
	for _, tc := range cases {
		tc.args = append(tc.args, "--pages", "lazy")
		t.Run(tc.name, func(t *testing.T) { l.recoverPodAfterCrashWith(t, tc, small) })
	}
}

// ballastChecksAfter waits until the consumer in pod has checked its whole
// ballast n times (its log), having never restarted, and returns its last
// check.
func (l *lab) ballastChecksAfter(t testing.TB, namespace, pod string, n int) string {
	t.Helper()
	ctx := context.Background()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := l.client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.RestartCount > 0 {
				return false, fmt.Errorf("container %s of %s restarted: its memory did not survive the move (last state %+v)", cs.Name, pod, cs.LastTerminationState)
			}
		}
		logs, err := l.client.CoreV1().Pods(namespace).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		checks := 0
		for _, line := range strings.Split(string(logs), "\n") {
			if strings.Contains(line, "ballast changed") {
				return false, fmt.Errorf("%s", line)
			}
			if strings.Contains(line, "ballast intact") {
				checks++
				last = line
			}
		}
		return checks >= n, nil
	})
	if err != nil {
		t.Fatalf("the copy's ballast checks: %v", err)
	}
	return last
}

// lazyRollBackWhenTheCopyDies: TestLazyPages's rollback.
func lazyRollBackWhenTheCopyDies(t *testing.T, l *lab, strategy string) {
	w := l.deployWith(t, lazyConsumer)
	before := waitApplied(t, w, "consumer", 20)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	killed := make(chan string, 1)
	go func() { killed <- l.killRestoredConsumer(ctx, w.Namespace) }()
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--strategy", strategy, "--pages", "lazy")
	cancel()
	what := <-killed
	if err == nil || rec.Outcome != report.RolledBack {
		t.Fatalf("outcome %s after %s: %v\n%s", rec.Outcome, what, err, stderr)
	}
	t.Logf("%s; the migration: %s", what, rec.Error)
	st := state(t, w, "consumer")
	if st.Process != before.Process {
		t.Fatalf("the source is not the same process after the rollback: %+v, was %+v", st, before)
	}
	waitApplied(t, w, "consumer", st.LastSeq+5)
	l.ballastChecksAfter(t, w.Namespace, "consumer", 2)
	l.nothingStagedFor(t, "")
	checkConservation(t, w, "consumer")
}

// killRestoredConsumer kills the consumer process restored on node-b as
// soon as it runs (the lab's nodes share this host's PID namespace: its
// cgroup names the target pod), and says what it did.
func (l *lab) killRestoredConsumer(ctx context.Context, namespace string) string {
	for ctx.Err() == nil {
		pods, err := l.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, p := range pods.Items {
				// Once the copy runs (its CRIU restore done): while its
				// pages still arrive.
				if p.Spec.NodeName != "node-b" || !strings.HasPrefix(p.Name, "consumer-") || !containerRunning(&p, "consumer") {
					continue
				}
				if pid := processInPod(string(p.UID), "ms2m-consumer"); pid > 0 {
					if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
						return fmt.Sprintf("killed the restored consumer (pid %d) of %s", pid, p.Name)
					}
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "never saw the restored consumer run"
}

// processInPod finds a process named comm whose cgroup is the pod's.
func processInPod(uid, comm string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(c)) != comm {
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if strings.Contains(string(cg), "pod"+uid) || strings.Contains(string(cg), "pod"+strings.ReplaceAll(uid, "-", "_")) {
			return pid
		}
	}
	return 0
}

func containerRunning(p *corev1.Pod, name string) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name && cs.State.Running != nil {
			return true
		}
	}
	return false
}

// BenchmarkLazyPages moves a consumer under the kubectl-migrate runtime
// holding each of E2E_SIZES (default 64Mi, 512Mi, 2Gi) with stop-and-copy
// and MS2M, its memory in the checkpoint (eager) and left in the source
// (lazy), alternating within each of E2E_EVAL_RUNS rounds (default 5). Per
// size, strategy and way: the downtime, the critical path, the checkpoint
// call (the source's freeze as the dump holds it), and with lazy pages the
// copy running to its last page, beside a plain node-to-node copy of the
// same bytes; and how the lazy downtime (stop-and-copy) and critical path
// (MS2M) grow from the smallest size to the largest.
//
//	go test -tags e2e -run '^$' -bench LazyPages -benchtime 1x ./test/e2e
func BenchmarkLazyPages(b *testing.B) {
	rounds := evalRounds(5)
	sizes := strings.Split(cmp.Or(os.Getenv("E2E_SIZES"), "64Mi,512Mi,2Gi"), ",")
	strategies := []string{"stop-and-copy", "ms2m"}
	l := setup(b)
	l.setUpRuntime(b)
	figures := map[string][]float64{}
	for i := 0; i < rounds; i++ {
		for _, size := range sizes {
			for _, strategy := range strategies {
				for _, pages := range []string{"eager", "lazy"} {
					o := lazyConsumer
					o.Ballast, o.VerifyBallast = size, ""
					// Frozen until its last page, the source must outlast the
					// freeze preflight predicts for 2 GiB (≈ 23 s at the lab's
					// rate): 8 failures of a probe every 5 s allow 37 s.
					o.LivenessFailures = 8
					w := l.deployWith(b, o)
					before := waitApplied(b, w, "consumer", 20)
					rec, stderr, err := l.migrate(b, w, "pod", "consumer", "--to", "node-b", "--strategy", strategy, "--pages", pages, "--label", "variant="+strategy+"-"+pages+"-"+size)
					if err != nil {
						b.Fatalf("%s %s %s: %v\n%s", strategy, pages, size, err, stderr)
					}
					l.checkMigrated(b, w, rec, before)
					checkConservation(b, w, rec.TargetPod)
					key := size + "-" + strategy + "-" + pages
					figures[key+"-downtime"] = append(figures[key+"-downtime"], float64(rec.Downtime.Millis))
					figures[key+"-critical-path"] = append(figures[key+"-critical-path"], float64(rec.CriticalPathMillis()))
					stepFigures(figures, key, rec, map[report.StepName]string{report.CheckpointCall: "checkpoint-call", report.LastPage: "last-page"})
					b.Logf("%s, %s, %s: downtime %d ms; %s", strategy, pages, size, rec.Downtime.Millis, stepSummary(rec))
					if err := w.Delete(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
			}
			q := resource.MustParse(size)
			took, err := fileNodeCopy(env(b, "LAB_RUN"), q.Value())
			if err != nil {
				b.Fatal(err)
			}
			figures[size+"-file-node-copy"] = append(figures[size+"-file-node-copy"], float64(took.Milliseconds()))
		}
	}
	ratio := func(a, b string) float64 { return median(figures[a]) / median(figures[b]) }
	for _, size := range sizes {
		b.ReportMetric(median(figures[size+"-file-node-copy"]), size+"-file-node-copy-ms")
		for _, strategy := range strategies {
			key := size + "-" + strategy
			for _, name := range []string{"eager-downtime", "lazy-downtime", "eager-critical-path", "lazy-critical-path", "eager-checkpoint-call", "lazy-checkpoint-call", "lazy-last-page"} {
				b.ReportMetric(median(figures[key+"-"+name]), key+"-"+name+"-ms")
			}
			b.ReportMetric(ratio(key+"-lazy-downtime", key+"-eager-downtime"), key+"-lazy/eager-downtime-ratio")
			b.ReportMetric(ratio(key+"-lazy-critical-path", key+"-eager-critical-path"), key+"-lazy/eager-critical-path-ratio")
			b.ReportMetric(ratio(key+"-lazy-last-page", size+"-file-node-copy"), key+"-last-page/file-copy-ratio")
		}
	}
	// How the lazy figures grow with memory: the largest size against the
	// smallest (the bound is 1.25).
	if len(sizes) > 1 {
		small, large := sizes[0], sizes[len(sizes)-1]
		b.ReportMetric(ratio(large+"-stop-and-copy-lazy-downtime", small+"-stop-and-copy-lazy-downtime"), "stop-and-copy-lazy-downtime-"+large+"/"+small+"-ratio")
		b.ReportMetric(ratio(large+"-ms2m-lazy-critical-path", small+"-ms2m-lazy-critical-path"), "ms2m-lazy-critical-path-"+large+"/"+small+"-ratio")
	}
}
