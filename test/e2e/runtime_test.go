//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// The restore path that needs no CRI restore: the kubectl-migrate runtime,
// selected by its RuntimeClass, restores the target container from the
// checkpoint the target's agent staged, with no image anywhere.

func runtimeRestored(pod *corev1.Pod) bool {
	return pod.Spec.RuntimeClassName != nil && *pod.Spec.RuntimeClassName == ociruntime.HandlerName
}

// nothingStaged checks that no checkpoint, nor the mark of one on its way,
// is left in node's stage.
func (l *lab) nothingStaged(t testing.TB, node string) {
	t.Helper()
	if left := staged(t, node, ""); len(left) != 0 {
		t.Fatalf("checkpoints left staged on %s: %v", node, left)
	}
}

// nothingStagedFor is nothingStaged on both nodes for namespace's pods
// alone, for a test that runs beside others that stage theirs; "" checks
// every namespace.
func (l *lab) nothingStagedFor(t testing.TB, namespace string) {
	t.Helper()
	for _, node := range []string{"node-a", "node-b"} {
		if left := staged(t, node, namespace); len(left) != 0 {
			t.Fatalf("checkpoints of %s left staged on %s: %v", namespace, node, left)
		}
	}
}

// staged lists what node's stage holds, in namespace ("" for every one).
func staged(t testing.TB, node, namespace string) []string {
	stage := filepath.Join(env(t, "LAB_RUN"), node, "upper", ociruntime.StageDir)
	var left []string
	_ = filepath.WalkDir(filepath.Join(stage, namespace), func(path string, d os.DirEntry, err error) error {
		if err == nil && path != stage {
			// NAMESPACE/POD/CONTAINER, or NAMESPACE/POD/.uid-UID(/CONTAINER)
			rel, _ := filepath.Rel(stage, path)
			if parts := strings.Split(rel, "/"); len(parts) == 3 || len(parts) == 4 && strings.HasPrefix(parts[2], ociruntime.UIDPrefix) {
				left = append(left, rel)
			}
		}
		return nil
	})
	return left
}

// nodeFiles lists the files of node's root that node-setup may touch
// (/etc, /opt), as "path mode size".
func nodeFiles(t testing.TB, node string) []string {
	t.Helper()
	upper := filepath.Join(env(t, "LAB_RUN"), node, "upper")
	var files []string
	for _, dir := range []string{"etc", "opt"} {
		_ = filepath.WalkDir(filepath.Join(upper, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			rel, _ := filepath.Rel(upper, path)
			files = append(files, fmt.Sprintf("%s %v %d", rel, info.Mode(), info.Size()))
			return nil
		})
	}
	return files
}

// installedRuntime is the kubectl-migrate runtime as the tests left it.
// A test that only needs it (useRuntime) leaves it installed when it ends,
// for the next test that needs it: node-setup and its uninstall restart
// the nodes' container runtime, half a minute each way, and serial tests
// follow one another. The next test that needs it gone (setup, on a lane
// whose container runtime restores; setUpRuntime) uninstalls it, and
// TestMain does if it is still there at the end.
var installedRuntime struct {
	sync.Mutex
	uninstall func(testing.TB) // nil while not installed
	users     int              // tests running that need it
}

// useRuntime makes sure the runtime is installed until t ends; tests
// running side by side share it.
func (l *lab) useRuntime(t testing.TB) {
	t.Helper()
	installedRuntime.Lock()
	defer installedRuntime.Unlock()
	if installedRuntime.uninstall == nil {
		installedRuntime.uninstall = l.installRuntime(t)
	}
	installedRuntime.users++
	t.Cleanup(func() {
		installedRuntime.Lock()
		defer installedRuntime.Unlock()
		installedRuntime.users--
	})
}

// dropRuntime uninstalls the runtime if it is installed and no running
// test needs it, and checks the nodes' files are as before it.
func dropRuntime(t testing.TB) {
	t.Helper()
	installedRuntime.Lock()
	defer installedRuntime.Unlock()
	if uninstall := installedRuntime.uninstall; uninstall != nil && installedRuntime.users == 0 {
		installedRuntime.uninstall = nil
		uninstall(t)
	}
}

// dropRuntimeAtExit uninstalls a runtime the last tests kept, once they
// all ended, so the lab is left as it was found; false if that failed.
func dropRuntimeAtExit() (ok bool) {
	exit := &exitTB{}
	defer func() {
		if r := recover(); r != nil && r != exit {
			panic(r)
		}
		ok = !exit.failed
	}()
	dropRuntime(exit)
	return
}

// exitTB reports for TestMain, where no test runs, on stderr; Fatal ends
// the function dropRuntimeAtExit called. The methods it does not define
// are never called (the nil testing.TB would panic).
type exitTB struct {
	testing.TB
	failed bool
}

func (e *exitTB) Helper()                 {}
func (e *exitTB) Log(args ...any)         { fmt.Fprintln(os.Stderr, args...) }
func (e *exitTB) Logf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (e *exitTB) Error(args ...any)       { e.failed = true; e.Log(args...) }
func (e *exitTB) Errorf(f string, a ...any) {
	e.failed = true
	e.Logf(f, a...)
}
func (e *exitTB) Fatal(args ...any) { e.Error(args...); panic(e) }
func (e *exitTB) Fatalf(f string, a ...any) {
	e.Errorf(f, a...)
	panic(e)
}

// setUpRuntime is for tests of node-setup itself: it uninstalls a runtime
// an earlier test left, installs it again on both nodes and checks that it
// is there. The function it returns (also the test's cleanup, if not
// called before) uninstalls it and checks the nodes' files are as before.
func (l *lab) setUpRuntime(t testing.TB) (uninstall func()) {
	t.Helper()
	dropRuntime(t)
	func() {
		installedRuntime.Lock()
		defer installedRuntime.Unlock()
		installedRuntime.uninstall = l.installRuntime(t)
		installedRuntime.users++
	}()
	var once sync.Once
	uninstall = func() {
		once.Do(func() {
			installedRuntime.Lock()
			installedRuntime.users--
			installedRuntime.Unlock()
			dropRuntime(t)
		})
	}
	t.Cleanup(uninstall)
	return uninstall
}

// restoresSomeWay makes sure the kubectl-migrate runtime is installed
// until t ends on lanes whose container runtime cannot restore (containerd
// 2.4), for tests that run on every lane.
func (l *lab) restoresSomeWay(t *testing.T) {
	if !criRestores() {
		l.useRuntime(t)
	}
}

// criRestores says whether the lane's container runtime restores a
// checkpoint itself (CRI-O, containerd 2.3 opted in); containerd 2.4 does
// not, so there the runtime is kept installed between tests.
func criRestores() bool {
	return os.Getenv("LAB_RUNTIME") != "containerd-2.4"
}

// installRuntime runs node-setup on both nodes and checks the runtime is
// there; the function it returns runs node-setup --uninstall and checks
// the nodes' files are as they were.
func (l *lab) installRuntime(t testing.TB) (undo func(testing.TB)) {
	t.Helper()
	ctx := context.Background()
	before := map[string][]string{}
	for _, n := range []string{"node-a", "node-b"} {
		before[n] = nodeFiles(t, n)
	}
	agentImage := l.imagePrefix + "/kubectl-migrate-agent:lab"
	out := l.kubectlMigrate(t, "node-setup", "--all", "--yes", "--agent-image", agentImage)
	t.Logf("node-setup:\n%s", out)
	for _, n := range []string{"node-a", "node-b"} {
		node, err := l.client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil || node.Labels[ociruntime.NodeLabel] != "installed" || !strings.Contains(out, n+" (") {
			t.Fatalf("node %s not set up: labels %v, %v\n%s", n, node.Labels, err, out)
		}
	}
	if _, err := l.client.NodeV1().RuntimeClasses().Get(ctx, ociruntime.HandlerName, metav1.GetOptions{}); err != nil {
		t.Fatalf("RuntimeClass: %v", err)
	}
	return func(t testing.TB) {
		out := l.kubectlMigrate(t, "node-setup", "--all", "--uninstall", "--yes", "--agent-image", agentImage)
		t.Logf("node-setup --uninstall:\n%s", out)
		if _, err := l.client.NodeV1().RuntimeClasses().Get(ctx, ociruntime.HandlerName, metav1.GetOptions{}); !isNotFound(err) {
			t.Errorf("RuntimeClass left: %v", err)
		}
		for _, n := range []string{"node-a", "node-b"} {
			node, err := l.client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := node.Labels[ociruntime.NodeLabel]; ok {
				t.Errorf("node %s keeps the label", n)
			}
			if after := nodeFiles(t, n); !slices.Equal(after, before[n]) {
				t.Errorf("node %s's files differ after uninstall:\nbefore %v\nafter  %v", n, before[n], after)
			}
		}
	}
}

// TestRuntimeRestore migrates the live consumer with --restore runtime as
// MS2M and as stop-and-copy (restored: same process, state continued; every
// message applied exactly once; nothing staged left, no image made), with
// emptyDir volumes too. The runtime is installed (node-setup) for it and
// the serial tests next to it; the uninstall that ends their share checks
// the nodes' files are as before.
//
// The crash cases run first, one at a time (a killed move holds the nodes'
// receive ports until its recovery); then the other moves side by side,
// each in namespaces of its own, taking turns only for those ports.
func TestRuntimeRestore(t *testing.T) {
	l := setupUnderRuntime(t)
	// A migration whose process dies is recovered: rolled back with the
	// checkpoint staged and not yet restored, completed after the target
	// took over; nothing is staged after either.
	for _, tc := range []crashCase{
		{name: "crash/restore", args: []string{"--restore", "runtime", "--inject-crash", "restore"}, want: report.RolledBack},
		{name: "crash/cleanup", args: []string{"--restore", "runtime", "--strategy", "stop-and-copy", "--inject-crash", "cleanup"}, want: report.Succeeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l.recoverPodAfterCrash(t, tc)
			l.nothingStagedFor(t, "")
		})
	}
	for _, strategy := range []string{"ms2m", "stop-and-copy"} {
		t.Run(strategy, func(t *testing.T) {
			t.Parallel()
			l, w, rec := migrateLivePod(t, "--restore", "runtime", "--strategy", strategy)
			// To the kubelet it was created, then started, as any
			// container: no failed start.
			events, err := l.client.CoreV1().Events(w.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + rec.TargetPod})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range events.Items {
				if e.Type == corev1.EventTypeWarning && e.Reason == "Failed" {
					t.Errorf("the kubelet failed on %s: %s", rec.TargetPod, e.Message)
				}
			}
			checkConservation(t, w, rec.TargetPod)
			l.nothingStagedFor(t, w.Namespace)
			t.Logf("runtime restore, %s: critical path %d ms, total %d ms, downtime %d ms", strategy, rec.CriticalPathMillis(), rec.TotalMillis, rec.Downtime.Millis)
		})
	}
	// emptyDir data moves on this path too, on disk and in memory (tmpfs):
	// the runtime fills the volumes in the create that restores, so the
	// target has no init container but the address one's noop (and the
	// pod's native sidecar, where it has one, started afresh before it);
	// the ledger the consumer keeps open there must hold every applied
	// message once (checkConservation).
	for _, tc := range []struct {
		scratch, strategy string
		sidecar           bool
	}{{"memory", "ms2m", false}, {"disk", "stop-and-copy", true}} {
		name := "emptyDir/" + tc.strategy + "/" + tc.scratch
		if tc.sidecar {
			name += "/sidecar"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l, w, rec, _, _ := migrateLiveApp(t, workload.Options{Rate: "10", Scratch: tc.scratch, Sidecar: tc.sidecar}, 30, "--restore", "runtime", "--strategy", tc.strategy)
			target, err := l.client.CoreV1().Pods(w.Namespace).Get(context.Background(), rec.TargetPod, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !runtimeRestored(target) || slices.ContainsFunc(target.Spec.InitContainers, func(c corev1.Container) bool {
				return c.Name != migrate.AddressInitContainer && c.Name != workload.SidecarName
			}) {
				t.Fatalf("the target was not restored by the runtime alone: runtime class %v, init containers %v", target.Spec.RuntimeClassName, target.Spec.InitContainers)
			}
			if tc.sidecar {
				checkSidecarRunning(t, target, 0)
			}
			checkConservation(t, w, rec.TargetPod)
			l.nothingStagedFor(t, w.Namespace)
		})
	}
	// A migration that fails after the restore rolls back: the source
	// serves, nothing is staged, every message is applied once.
	t.Run("rollback", func(t *testing.T) {
		t.Parallel()
		w := failedMigrationRollsBack(t, l, "--restore", "runtime")
		l.nothingStagedFor(t, w.Namespace)
	})
}

// TestEveryMoveThroughTheRuntime (containerd-2.4 lane): with the runtime
// set up on both nodes and no flag, every kind of move restores through it,
// since containerd 2.4 cannot: a StatefulSet pod sequentially, through a
// shadow (its emptyDir ledger moving twice), and rolled back after its source was deleted (the source comes
// back from its kept checkpoint, staged on its own node); the threshold
// cutoff; and a drain of bare, Deployment and StatefulSet pods. Each ends
// with the conservation check; nothing is left staged.
func TestEveryMoveThroughTheRuntime(t *testing.T) {
	if criRestores() {
		t.Skip("needs a runtime without CRI restore: run on the containerd-2.4 lane (LAB_RUNTIME=containerd-2.4)")
	}
	l := setupUnderRuntime(t)
	// The crash cases and the drain run first, one at a time: a killed move
	// holds the nodes' receive ports until its recovery, and the drain
	// moves whatever runs on node-a. The other moves then run side by side,
	// each in namespaces of its own.
	//
	// A StatefulSet move whose process dies is recovered through the
	// runtime too: rolled back after the source was deleted (restored from
	// the archives kept on its node) or during a shadow's final stage, and
	// completed past the commit point; E2E_CRASH_MATRIX=all, every step.
	for _, tc := range everyStep([]crashCase{
		{name: "sequential/restore", args: []string{"--inject-crash", "restore"}, want: report.RolledBack},
		{name: "shadow/detach-final", args: []string{"--mode", "shadow", "--inject-crash", "detach/final"}, want: report.RolledBack},
		{name: "sequential/cleanup", args: []string{"--inject-crash", "cleanup"}, want: report.Succeeded},
	}, contractStatefulSet) {
		t.Run("sts/crash/"+tc.name, func(t *testing.T) {
			rec := l.recoverStatefulSetAfterCrash(t, tc)
			if rec.Restore != "runtime" {
				t.Fatalf("restored through %q", rec.Restore)
			}
			l.nothingStagedFor(t, "")
		})
	}
	t.Run("drain", func(t *testing.T) {
		took, sum := l.drainNodeA(t)
		t.Logf("drain through the runtime took %s; its migrations add up to %s", took, sum)
		l.nothingStagedFor(t, "")
	})
	for _, mode := range []string{"sequential", "shadow"} {
		t.Run("sts/"+mode, func(t *testing.T) {
			t.Parallel()
			// Through a shadow, the emptyDir moves twice.
			var mutate func(string, *appsv1.StatefulSet)
			if mode == "shadow" {
				mutate = keepsALedger
			}
			rec := migrateStatefulSet(t, mutate, "--mode", mode)
			if rec.Restore != "runtime" {
				t.Fatalf("restored through %q", rec.Restore)
			}
			l.nothingStagedFor(t, rec.Namespace)
		})
	}
	t.Run("sts/rollback", func(t *testing.T) {
		t.Parallel()
		rec := rollBackStatefulSet(t, "--replay-timeout", "1ms")
		l.nothingStagedFor(t, rec.Namespace)
	})
	// The bind comes after the target's address, so only checkpoint,
	// transfer and restore (about a second) precede the replay here, and
	// at 16 msg/s one replay ended in 1.96 s, before a T_cutoff of 2.5 s.
	// At 18 msg/s against μ ≈ 19.5/s the replay would take many seconds,
	// T_cutoff = 1 s · μ/λ ≈ 1.1 s: the cutoff fires however quick the
	// restore (and sooner still on a machine the other moves load).
	t.Run("cutoff", func(t *testing.T) {
		t.Parallel()
		_, w, rec := migrateLivePodAt(t, "18", "--replay-max", "1s")
		if rec.Restore != "runtime" || rec.Cutoff == nil || !rec.Cutoff.Fired {
			t.Fatalf("restore %q, cutoff %+v", rec.Restore, rec.Cutoff)
		}
		checkConservation(t, w, rec.TargetPod)
	})
}
