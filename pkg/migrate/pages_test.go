package migrate_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

func lazyConfig() migrate.Config {
	c := testConfig(migrate.StopAndCopy)
	c.Pages = migrate.PagesLazy
	return c
}

// TestLazyPagesCommitOnlyOnceTheLastPageArrived: the source's checkpoint
// leaves its pages in it, the source's agent sends them after the
// archive, and the migration commits only once the target reports its
// last page: the step is in the report.
func TestLazyPagesCommitOnlyOnceTheLastPageArrived(t *testing.T) {
	t.Parallel()
	w := lazyWorld(t, true)
	rec, err := migrate.Run(context.Background(), lazyConfig(), w.Deps(), migrate.Hooks{})
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("%v %s", err, rec.Outcome)
	}
	calls := strings.Join(w.Calls, "\n")
	order := []string{
		"the pages of default/consumer/app stay in the source",
		"pages of default/consumer/app (uid source-uid) follow",
		"pages of 1 container(s) on node-b",
	}
	at := -1
	for _, want := range order {
		i := strings.Index(calls, want)
		if i < at {
			t.Fatalf("%q missing or out of order in:\n%s", want, calls)
		}
		at = i
	}
	ph, _ := rec.Phase(report.Restore)
	if !slices.ContainsFunc(ph.Steps, func(s report.Step) bool { return s.Name == report.LastPage }) {
		t.Errorf("no %q step in the restore: %+v", report.LastPage, ph.Steps)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
}

func lazyMS2MConfig() migrate.Config {
	c := testConfig(migrate.MS2M)
	c.Pages = migrate.PagesLazy
	return c
}

// TestLazyPagesWithMS2M: the copy replays while its pages arrive from the
// source, which its lazy checkpoint froze; only once the last page arrived
// and the source runs again is the source told its checkpoint is taken (a
// frozen source answers nothing), and the switchover follows as always.
func TestLazyPagesWithMS2M(t *testing.T) {
	t.Parallel()
	w := lazyWorld(t, true)
	rec, err := migrate.Run(context.Background(), lazyMS2MConfig(), w.Deps(), migrate.Hooks{})
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("%v %s", err, rec.Outcome)
	}
	calls := strings.Join(w.Calls, "\n")
	order := []string{
		"the pages of default/consumer/app stay in the source",
		"control consumer-abcde START_REPLAY",
		"pages of 1 container(s) on node-b",
		"pages of 1 container(s) on node-a",
		"control consumer CHECKPOINTED",
		"control consumer STOP",
		"control consumer-abcde END_REPLAY",
	}
	at := -1
	for _, want := range order {
		i := strings.Index(calls, want)
		if i < at {
			t.Fatalf("%q missing or out of order in:\n%s", want, calls)
		}
		at = i
	}
	ph, _ := rec.Phase(report.Replay)
	if !slices.ContainsFunc(ph.Steps, func(s report.Step) bool { return s.Name == report.LastPage }) {
		t.Errorf("no %q step in the replay: %+v", report.LastPage, ph.Steps)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
}

// TestLazyPagesWithMS2MThatDoNotArriveRollBack: the page stream broke
// while the copy replayed; the copy goes, the source runs again once its
// session ended, and no message is lost or applied twice.
func TestLazyPagesWithMS2MThatDoNotArriveRollBack(t *testing.T) {
	t.Parallel()
	w := lazyWorld(t, true)
	w.PagesLost = true
	rec, err := migrate.Run(context.Background(), lazyMS2MConfig(), w.Deps(), migrate.Hooks{})
	if err == nil || rec.Outcome != report.RolledBack || !strings.Contains(err.Error(), "did not all arrive") {
		t.Fatalf("%v %s", err, rec.Outcome)
	}
	if _, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{}); err == nil {
		t.Fatal("the target is left")
	}
	if len(w.Staged) != 0 || len(w.Archives) != 0 {
		t.Fatalf("left: %v %v", w.Staged, w.Archives)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
}

// TestLazyPagesThatDoNotArriveRollBack: the page stream broke before the
// last page; the copy is not committed to: the target goes, the source
// (which resumes as its page session ends) stays, nothing is lost.
func TestLazyPagesThatDoNotArriveRollBack(t *testing.T) {
	t.Parallel()
	w := lazyWorld(t, true)
	w.PagesLost = true
	rec, err := migrate.Run(context.Background(), lazyConfig(), w.Deps(), migrate.Hooks{})
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
}

// TestLazyPagesNeedThePodUnderTheRuntime: a source the kubectl-migrate
// runtime does not run cannot leave its pages: refused before any change,
// naming the fix; and the choices that cannot go with lazy pages are
// refused from the flags alone.
func TestLazyPagesNeedThePodUnderTheRuntime(t *testing.T) {
	t.Parallel()
	w := lazyWorld(t, false)
	_, err := migrate.Run(context.Background(), lazyConfig(), w.Deps(), migrate.Hooks{})
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
		cfg := lazyConfig()
		c(&cfg)
		if err := cfg.ValidateChoices(); err == nil || !strings.Contains(err.Error(), "--pages") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestRecoverLazyPagesFromACrashAtEveryStep kills a lazy stop-and-copy
// and a lazy MS2M move at each step and recovers it: before the commit point (the last page) the
// source serves again, nothing left behind; after it the target serves;
// no message is lost or applied twice.
func TestRecoverLazyPagesFromACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	world := func(t *testing.T) *migratetest.World { return lazyWorld(t, true) }
	for _, cfg := range []migrate.Config{lazyConfig(), lazyMS2MConfig()} {
		steps := crashSteps(t, world, cfg)
		for n := 1; n <= steps; n++ {
			t.Run(fmt.Sprintf("%s/%d", cfg.Strategy, n), func(t *testing.T) {
				t.Parallel()
				recoverPodAt(t, world(t), cfg, n)
			})
		}
	}
}
