package migrate_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// lazyWorld has the kubectl-migrate runtime on both nodes, and the source
// pod under its RuntimeClass if underRuntime.
func lazyWorld(t *testing.T, underRuntime bool) *migratetest.World {
	t.Helper()
	ctx := context.Background()
	w := migratetest.NewWorld(t)
	for _, name := range []string{"node-a", "node-b"} {
		node, err := w.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.4.2"
		node.Labels = map[string]string{ociruntime.NodeLabel: "installed"}
		if _, err := w.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if underRuntime {
		pod, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Spec.RuntimeClassName = ptr.To(ociruntime.HandlerName)
		if _, err := w.Client.CoreV1().Pods("default").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func lazyConfig(strategy migrate.Strategy) migrate.Config {
	c := testConfig(strategy)
	c.Pages = migrate.PagesLazy
	return c
}

// TestLazyPagesCommitOnlyOnceTheLastPageArrived: the source's checkpoint
// leaves its pages in it, the source's agent sends them after the
// archive, and the migration switches over only once the target reports
// its last page: the step is in the report. With MS2M the copy replays
// meanwhile, and the source, which its lazy checkpoint froze, is told its
// checkpoint is taken only once it runs again (frozen, it answers nothing).
func TestLazyPagesCommitOnlyOnceTheLastPageArrived(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		strategy migrate.Strategy
		order    []string
		lastPage report.PhaseName
	}{
		{migrate.StopAndCopy, []string{
			"the pages of default/consumer/app stay in the source",
			"pages of default/consumer/app (uid source-uid) follow",
			"pages of 1 container(s) on node-b",
		}, report.Restore},
		{migrate.MS2M, []string{
			"the pages of default/consumer/app stay in the source",
			"control consumer-abcde START_REPLAY",
			"pages of 1 container(s) on node-b",
			"pages of 1 container(s) on node-a",
			"control consumer CHECKPOINTED",
			"control consumer STOP",
			"control consumer-abcde END_REPLAY",
		}, report.Replay},
	} {
		t.Run(string(tc.strategy), func(t *testing.T) {
			t.Parallel()
			w := lazyWorld(t, true)
			rec, err := migrate.Run(context.Background(), lazyConfig(tc.strategy), w.Deps(), migrate.Hooks{})
			if err != nil || rec.Outcome != report.Succeeded {
				t.Fatalf("%v %s", err, rec.Outcome)
			}
			calls := strings.Join(w.Calls, "\n")
			at := -1
			for _, want := range tc.order {
				i := strings.Index(calls, want)
				if i < at {
					t.Fatalf("%q missing or out of order in:\n%s", want, calls)
				}
				at = i
			}
			ph, _ := rec.Phase(tc.lastPage)
			if !slices.ContainsFunc(ph.Steps, func(s report.Step) bool { return s.Name == report.LastPage }) {
				t.Errorf("no %q step in the %s: %+v", report.LastPage, tc.lastPage, ph.Steps)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLazyPagesThatDoNotArriveRollBack: the page stream broke before the
// last page (with MS2M, while the copy replayed); the copy is not
// committed to: the target goes, the source (which resumes as its page
// session ends) stays, nothing is lost or applied twice.
func TestLazyPagesThatDoNotArriveRollBack(t *testing.T) {
	t.Parallel()
	for _, strategy := range []migrate.Strategy{migrate.StopAndCopy, migrate.MS2M} {
		t.Run(string(strategy), func(t *testing.T) {
			t.Parallel()
			w := lazyWorld(t, true)
			w.PagesLost = true
			rec, err := migrate.Run(context.Background(), lazyConfig(strategy), w.Deps(), migrate.Hooks{})
			if err == nil || rec.Outcome != report.RolledBack || !strings.Contains(err.Error(), "did not all arrive") {
				t.Fatalf("%v %s", err, rec.Outcome)
			}
			if _, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{}); err == nil {
				t.Fatal("the target is left")
			}
			if _, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer", metav1.GetOptions{}); err != nil {
				t.Fatalf("the source is gone: %v", err)
			}
			if len(w.Staged) != 0 || len(w.Archives) != 0 {
				t.Fatalf("left: %v %v", w.Staged, w.Archives)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLazyPagesNeedThePodUnderTheRuntime: a source the kubectl-migrate
// runtime does not run cannot leave its pages: refused before any change,
// naming the fix; and the choices that cannot go with lazy pages are
// refused from the flags alone.
func TestLazyPagesNeedThePodUnderTheRuntime(t *testing.T) {
	t.Parallel()
	w := lazyWorld(t, false)
	_, err := migrate.Run(context.Background(), lazyConfig(migrate.StopAndCopy), w.Deps(), migrate.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "runtimeClassName: kubectl-migrate") || !strings.Contains(err.Error(), "--pages eager") {
		t.Fatalf("want a refusal naming the RuntimeClass, got %v", err)
	}
	if strings.Contains(strings.Join(w.Calls, "\n"), "checkpoint default/consumer") {
		t.Fatal("checkpointed although refused")
	}
	for name, c := range map[string]func(*migrate.Config){
		"any pod":       func(c *migrate.Config) { c.Strategy = migrate.CheckpointRestore },
		"cri restore":   func(c *migrate.Config) { c.Restore = migrate.RestoreCRI },
		"a statefulset": func(c *migrate.Config) { c.StatefulSet, c.TargetName, c.Mode = "web", "consumer", migrate.Sequential },
		"a typo":        func(c *migrate.Config) { c.Pages = "lazzy" },
	} {
		cfg := lazyConfig(migrate.StopAndCopy)
		c(&cfg)
		if err := cfg.ValidateChoices(); err == nil || !strings.Contains(err.Error(), "--pages") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestLazyPagesOnlyWhereTheLivenessProbeOutlastsTheFreeze: the source
// stays frozen until its last page arrived, and a liveness probe that
// gives up sooner would have the kubelet restart it, its memory lost. With
// the lab's rate (no earlier moves here), 2 GiB freeze about 20 s; a probe
// every 5 s timing out after 2 s restarts it after 12 s frozen (3
// failures), 22 s (5). Refused before any change, naming the
// failureThreshold that would do; a freeze that cannot be told (no memory
// limit) is refused too.
func TestLazyPagesOnlyWhereTheLivenessProbeOutlastsTheFreeze(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		limit     string
		threshold int32
		refusal   string // "" runs
	}{
		{"2GiB, 3 failures", "2Gi", 3, "raise its failureThreshold to 5, or move it with --pages eager"},
		{"no limit", "", 3, "give the pod memory limits, or move it with --pages eager"},
		{"512MiB, 3 failures", "512Mi", 3, ""},
		{"2GiB, 5 failures", "2Gi", 5, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			w := lazyWorld(t, true)
			pod, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := &pod.Spec.Containers[0]
			c.LivenessProbe = &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
				PeriodSeconds: 5, TimeoutSeconds: 2, FailureThreshold: tc.threshold,
			}
			if tc.limit != "" {
				c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(tc.limit)}
			}
			if _, err := w.Client.CoreV1().Pods("default").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			rec, err := migrate.Run(ctx, lazyConfig(migrate.StopAndCopy), w.Deps(), migrate.Hooks{})
			if tc.refusal == "" {
				if err != nil || rec.Outcome != report.Succeeded {
					t.Fatalf("want the move, got %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.refusal) {
				t.Fatalf("want a refusal ending %q, got %v", tc.refusal, err)
			}
			if strings.Contains(strings.Join(w.Calls, "\n"), "checkpoint default/consumer") {
				t.Fatal("checkpointed although refused")
			}
		})
	}
}

// TestRecoverLazyPagesFromACrashAtEveryStep kills a lazy stop-and-copy
// and a lazy MS2M move at each step and recovers it: before the commit point (the last page) the
// source serves again, nothing left behind; after it the target serves;
// no message is lost or applied twice.
func TestRecoverLazyPagesFromACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	world := func(t *testing.T) *migratetest.World { return lazyWorld(t, true) }
	for _, cfg := range []migrate.Config{lazyConfig(migrate.StopAndCopy), lazyConfig(migrate.MS2M)} {
		steps := crashSteps(t, world, cfg)
		for n := 1; n <= steps; n++ {
			t.Run(fmt.Sprintf("%s/%d", cfg.Strategy, n), func(t *testing.T) {
				t.Parallel()
				recoverPodAt(t, world(t), cfg, n)
			})
		}
	}
}
