package migrate_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

func stsConfig(s migrate.Strategy, mode migrate.StatefulSetMode) migrate.Config {
	cfg := testConfig(s)
	cfg.Pod, cfg.TargetName, cfg.StatefulSet, cfg.Mode = "consumer-0", "consumer-0", "consumer", mode
	cfg.ReplayTimeout, cfg.PhaseTimeout = 3*time.Second, 3*time.Second
	if !s.Contract() {
		cfg.Broker = migrate.BrokerConfig{}
	}
	return cfg
}

// stsWorld is a StatefulSet world and a migration of consumer-0 in it;
// for checkpoint/restore its applications follow no contract.
func stsWorld(t *testing.T, s migrate.Strategy, mode migrate.StatefulSetMode) (*migratetest.World, migrate.Config) {
	w, cfg := migratetest.NewStatefulSetWorld(t), stsConfig(s, mode)
	if !s.Contract() {
		dropContract(t, w)
	}
	return w, cfg
}

// checkStatefulSet checks that consumer-0 runs on node with the original
// process, consuming its primary queue, owned by a StatefulSet whose spec is
// unchanged, that no member was ever recreated afresh, that consumer-1 was
// not touched and that nothing the migration made is left.
func checkStatefulSet(t *testing.T, w *migratetest.World, node string, before *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	sts, err := w.Client.AppsV1().StatefulSets("default").Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the StatefulSet is gone: %v", err)
	}
	if *sts.Spec.Replicas != 2 || sts.Spec.Selector.MatchLabels["app"] != "consumer" {
		t.Fatalf("StatefulSet spec changed: %+v", sts.Spec)
	}
	// Owned already: a migration ends, rolled back or not, only once the
	// StatefulSet adopted its pod again (the controller does it a moment
	// after the StatefulSet is created again).
	pod, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-0", metav1.GetOptions{})
	if owner := metav1.GetControllerOf(pod); err != nil || owner == nil || owner.UID != sts.UID || pod.Spec.NodeName != node || pod.Labels["statefulset.kubernetes.io/pod-name"] != "consumer-0" {
		t.Fatalf("consumer-0 on %s, labels %v, owned by %+v, want node %s owned by %s", pod.Spec.NodeName, pod.Labels, metav1.GetControllerOf(pod), node, sts.UID)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if app := w.Apps["consumer-0"]; app.Process != "p1" || app.Mode != protocol.ModePrimary || app.PendingRestore {
		t.Fatalf("consumer-0 lost its state or does not serve: %+v", app)
	}
	if i := slices.IndexFunc(w.Calls, func(c string) bool { return strings.Contains(c, "afresh") }); i >= 0 {
		t.Fatalf("the StatefulSet controller raced the migration: %s", w.Calls[i])
	}
	if other, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-1", metav1.GetOptions{}); err != nil || other.UID != before.UID || other.Spec.NodeName != "node-a" {
		t.Fatalf("consumer-1 was touched: %v", err)
	}
	if _, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-0-shadow", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("shadow pod left: %v", err)
	}
	if len(w.Queues) != 1 || len(w.Archives) != 0 {
		t.Fatalf("left behind: queues %v archives %v", w.Queues, w.Archives)
	}
}

// wait polls cond for up to two seconds: the fake controller adopts
// asynchronously.
func wait(cond func() bool) error {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return nil
		}
	}
	return fmt.Errorf("condition not met in 2s")
}

func consumer1(t *testing.T, w *migratetest.World) *corev1.Pod {
	pod, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// selectedCopy is the labels of consumer-0's copy that its StatefulSet
// (app) or a per-pod Service selects it by.
func selectedCopy(t *testing.T, w *migratetest.World) []string {
	pod, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-0", metav1.GetOptions{})
	if err != nil {
		t.Error(err)
		return nil
	}
	var selected []string
	for _, k := range []string{"app", appsv1.StatefulSetPodNameLabel} {
		if _, ok := pod.Labels[k]; ok {
			selected = append(selected, k)
		}
	}
	return selected
}

func TestStatefulSetModes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		strategy migrate.Strategy
		mode     migrate.StatefulSetMode
		phases   string
	}{
		{migrate.MS2M, migrate.Sequential, "preflight setup prepare checkpoint image detach restore adopt replay switchover cleanup"},
		{migrate.StopAndCopy, migrate.Sequential, "preflight setup stop checkpoint image detach restore adopt switchover cleanup"},
		{migrate.CheckpointRestore, migrate.Sequential, "preflight setup stop checkpoint image detach restore switchover adopt cleanup"},
		{migrate.MS2M, migrate.Shadow, "preflight setup prepare/shadow checkpoint/shadow image/shadow restore/shadow replay/shadow switchover/shadow " +
			"prepare/final checkpoint/final image/final detach/final restore/final adopt/final replay/final switchover/final cleanup/final"},
	} {
		t.Run(string(tc.strategy)+"/"+string(tc.mode), func(t *testing.T) {
			w, cfg := stsWorld(t, tc.strategy, tc.mode)
			other := consumer1(t, w)
			var selectedEarly []string
			hooks := migrate.Hooks{PhaseStarted: func(p report.PhaseTiming) {
				if tc.strategy == migrate.CheckpointRestore && p.Name == report.Switchover {
					selectedEarly = selectedCopy(t, w)
				}
			}}
			rec, err := migrate.Run(context.Background(), cfg, w.Deps(), hooks)
			if err != nil {
				t.Fatal(err)
			}
			if len(selectedEarly) > 0 {
				// A client it had before the commit would lose its writes to
				// a rollback, which restores the checkpoint.
				t.Fatalf("before the switchover the copy carried labels a Service or its StatefulSet selects it by: %v", selectedEarly)
			}
			var phases []string
			for _, p := range rec.Phases {
				phases = append(phases, strings.TrimSuffix(string(p.Name)+"/"+p.Stage, "/"))
			}
			if got := strings.Join(phases, " "); got != tc.phases {
				t.Fatalf("phases\n%s\nwant\n%s", got, tc.phases)
			}
			checkStatefulSet(t, w, "node-b", other)
			if rec.Outcome != report.Succeeded || rec.TargetPod != "consumer-0" || rec.Mode != string(tc.mode) {
				t.Fatalf("record %+v", rec)
			}
			if tc.mode != migrate.Shadow {
				return
			}
			// The source serves until the shadow took over, and the
			// StatefulSet is orphaned only after that.
			order := strings.Join(w.Calls, "\n")
			if !(strings.Index(order, "checkpoint default/consumer-0/app") < strings.Index(order, "control consumer-0 STOP") &&
				strings.Index(order, "control consumer-0 STOP") < strings.Index(order, "control consumer-0-shadow END_REPLAY") &&
				strings.Index(order, "control consumer-0-shadow END_REPLAY") < strings.Index(order, "delete statefulset") &&
				strings.Index(order, "delete statefulset") < strings.Index(order, "control consumer-0-shadow STOP") &&
				strings.Index(order, "control consumer-0-shadow STOP") < strings.Index(order, "control consumer-0 END_REPLAY")) {
				t.Fatalf("wrong order:\n%s", order)
			}
			if rec.Shadow == nil || rec.Shadow.Pod != "consumer-0-shadow" || rec.Downtime == nil ||
				rec.Downtime.Millis != rec.Shadow.ToShadowMillis+rec.Shadow.ToFinalMillis {
				t.Fatalf("shadow gaps %+v downtime %+v", rec.Shadow, rec.Downtime)
			}
		})
	}
}

// TestStatefulSetRollbackAtEveryPhase fails each phase of each mode in turn
// (in shadow mode, in either stage) and checks that the StatefulSet and its
// pod come back on the source node with their state, serving.
func TestStatefulSetRollbackAtEveryPhase(t *testing.T) {
	t.Parallel()
	type failure struct {
		phase report.PhaseName
		nth   int
	}
	for _, tc := range []struct {
		strategy migrate.Strategy
		mode     migrate.StatefulSetMode
		failures []failure
	}{
		{migrate.MS2M, migrate.Sequential, []failure{
			{report.Prepare, 0}, {report.Checkpoint, 0}, {report.Image, 0}, {report.Detach, 0},
			{report.Restore, 1}, {report.Adopt, 0}, {report.Replay, 1}, {report.Switchover, 1}}},
		{migrate.StopAndCopy, migrate.Sequential, []failure{{report.Checkpoint, 0}, {report.Restore, 1}, {report.Adopt, 0}}},
		{migrate.CheckpointRestore, migrate.Sequential, []failure{{report.Stop, 0}, {report.Checkpoint, 0}, {report.Image, 0}, {report.Detach, 0}, {report.Restore, 1}}},
		{migrate.MS2M, migrate.Shadow, []failure{
			{report.Prepare, 1}, {report.Checkpoint, 1}, {report.Image, 1}, {report.Restore, 1}, {report.Replay, 1}, {report.Switchover, 1},
			{report.Prepare, 2}, {report.Checkpoint, 2}, {report.Image, 2}, {report.Detach, 1}, {report.Restore, 2},
			{report.Adopt, 0}, {report.Replay, 2}, {report.Switchover, 2}}},
	} {
		for _, f := range tc.failures {
			t.Run(fmt.Sprintf("%s/%s/%s#%d", tc.strategy, tc.mode, f.phase, f.nth), func(t *testing.T) {
				t.Parallel() // each mostly waits on the engine's polls, not the CPU
				w, cfg := stsWorld(t, tc.strategy, tc.mode)
				w.FailOn(f.phase, f.nth)
				other := consumer1(t, w)
				rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
				if err == nil || rec.Outcome != report.RolledBack {
					t.Fatalf("want a rolled-back migration, got %v (%s)", err, rec.Outcome)
				}
				w.FailOn("", 0) // the controller adopts again
				checkStatefulSet(t, w, "node-a", other)
			})
		}
	}
}

func TestStatefulSetValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(*migrate.Config)
		want   string
	}{
		{"shadow needs ms2m", func(c *migrate.Config) { c.Strategy, c.Mode = migrate.StopAndCopy, migrate.Shadow }, "needs --strategy ms2m"},
		{"unknown mode", func(c *migrate.Config) { c.Mode = "parallel" }, `--mode must be one of [sequential shadow], not "parallel"`},
		{"cutoff", func(c *migrate.Config) { c.ReplayMax = time.Second }, "apply to kubectl migrate pod"},
		{"mode on a bare pod", func(c *migrate.Config) { c.StatefulSet = "" }, "--mode applies to StatefulSet pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := stsConfig(migrate.MS2M, migrate.Sequential)
			tc.mutate(&cfg)
			if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestStatefulSetSpecKept checks the re-created StatefulSet's spec is the
// saved one, field for field.
func TestStatefulSetSpecKept(t *testing.T) {
	t.Parallel()
	w := migratetest.NewStatefulSetWorld(t)
	ctx := context.Background()
	before, _ := w.Client.AppsV1().StatefulSets("default").Get(ctx, "consumer", metav1.GetOptions{})
	if _, err := migrate.Run(ctx, stsConfig(migrate.MS2M, migrate.Shadow), w.Deps(), migrate.Hooks{}); err != nil {
		t.Fatal(err)
	}
	after, _ := w.Client.AppsV1().StatefulSets("default").Get(ctx, "consumer", metav1.GetOptions{})
	if !reflect.DeepEqual(before.Spec, after.Spec) || after.UID == before.UID {
		t.Fatalf("spec %+v, want %+v (a new object)", after.Spec, before.Spec)
	}
}

// TestVolumePreflight checks which volumes can follow a StatefulSet pod.
func TestVolumePreflight(t *testing.T) {
	t.Parallel()
	csi := corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "disk.example.com", VolumeHandle: "vol-1"}}
	onlyNodeA := &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}},
	}}}}
	rwo, rwx := []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
	for _, tc := range []struct {
		name   string
		mode   migrate.StatefulSetMode
		volume corev1.VolumeSource
		pv     corev1.PersistentVolumeSpec
		want   string // "" means accepted
	}{
		{"local", migrate.Sequential, corev1.VolumeSource{}, corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/disk"}}, NodeAffinity: onlyNodeA, AccessModes: rwo}, "a local volume at /mnt/disk on node-a"},
		{"hostPath PV", migrate.Sequential, corev1.VolumeSource{}, corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv"}}, AccessModes: rwo}, "a hostPath volume at /srv"},
		{"zonal disk", migrate.Sequential, corev1.VolumeSource{}, corev1.PersistentVolumeSpec{PersistentVolumeSource: csi, NodeAffinity: onlyNodeA, AccessModes: rwo}, "which node node-b cannot reach"},
		{"network disk, sequential", migrate.Sequential, corev1.VolumeSource{}, corev1.PersistentVolumeSpec{PersistentVolumeSource: csi, AccessModes: rwo}, ""},
		{"network disk, shadow", migrate.Shadow, corev1.VolumeSource{}, corev1.PersistentVolumeSpec{PersistentVolumeSource: csi, AccessModes: rwo}, "not ReadWriteMany"},
		{"shared filesystem, shadow", migrate.Shadow, corev1.VolumeSource{}, corev1.PersistentVolumeSpec{PersistentVolumeSource: csi, AccessModes: rwx}, ""},
		{"emptyDir (its data moves)", migrate.Sequential, corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}, corev1.PersistentVolumeSpec{}, ""},
		{"hostPath", migrate.Sequential, corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/srv"}}, corev1.PersistentVolumeSpec{}, "is hostPath /srv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := migratetest.NewStatefulSetWorld(t)
			ctx := context.Background()
			source := tc.volume
			if source == (corev1.VolumeSource{}) {
				source = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-consumer-0"}}
				pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}, Spec: tc.pv}
				pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-consumer-0", Namespace: "default"},
					Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-1"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
				if _, err := w.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				if _, err := w.Client.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			pod, _ := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-0", metav1.GetOptions{})
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: source})
			pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
			if _, err := w.Client.CoreV1().Pods("default").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			cfg := stsConfig(migrate.MS2M, tc.mode)
			cfg.DryRun = true
			_, err := migrate.Run(ctx, cfg, w.Deps(), migrate.Hooks{})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestInjectedFailureRollsBack fails a phase that did its work, which the
// e2e tests use to prove rollback on the lab.
func TestInjectedFailureRollsBack(t *testing.T) {
	t.Parallel()
	w := migratetest.NewStatefulSetWorld(t)
	other := consumer1(t, w)
	cfg := stsConfig(migrate.MS2M, migrate.Shadow)
	cfg.InjectFailure = "replay/final"
	rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "--inject-failure") || rec.Outcome != report.RolledBack {
		t.Fatalf("got %v (%s)", err, rec.Outcome)
	}
	if p := rec.Phases[len(rec.Phases)-1]; p.Name != report.Replay || p.Stage != "final" || !p.RolledBack {
		t.Fatalf("last phase %+v", p)
	}
	checkStatefulSet(t, w, "node-a", other)
}

// TestShadowGapsComeFromThePodThatServed: the first switchover's gap is the
// shadow's, read while it serves, even when the final pod's history has the
// same message later, from its own replay (the final stage checkpointed the
// shadow before the shadow applied it); the second is the final pod's.
func TestShadowGapsComeFromThePodThatServed(t *testing.T) {
	t.Parallel()
	w := migratetest.NewStatefulSetWorld(t)
	consumer1(t, w)
	w.AppliedDelay = map[string]time.Duration{"consumer-0-shadow": 100 * time.Millisecond, "consumer-0": 2400 * time.Millisecond}
	rec, err := migrate.Run(context.Background(), stsConfig(migrate.MS2M, migrate.Shadow), w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Shadow == nil || rec.Shadow.ToShadowMillis != 100 || rec.Shadow.ToFinalMillis != 2400 || rec.Downtime == nil || rec.Downtime.Millis != 2500 {
		t.Fatalf("shadow gaps %+v, downtime %+v: want 100 ms read from the shadow, 2400 ms from the final pod", rec.Shadow, rec.Downtime)
	}
}

// runtimeOnly makes w's nodes run containerd 2.4 (no CRI restore), with the
// kubectl-migrate runtime installed on nodes.
func runtimeOnly(t *testing.T, w *migratetest.World, nodes ...string) {
	t.Helper()
	ctx := context.Background()
	for _, name := range []string{"node-a", "node-b"} {
		node, err := w.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.4.2"
		if slices.Contains(nodes, name) {
			node.Labels = map[string]string{ociruntime.NodeLabel: "installed"}
		}
		if _, err := w.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStatefulSetRuntimeRestore moves a StatefulSet pod between nodes whose
// runtime does not restore, through the kubectl-migrate runtime on both, in
// each mode: the checkpoint goes node to node and is staged, no image is
// made, and nothing is left staged or archived; failed after the source was
// deleted, the source comes back from its kept archive, staged on its own
// node. Without the runtime on the source node it is refused, naming the
// setup, as its rollback could not restore there.
func TestStatefulSetRuntimeRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	runtimeOn := func(w *migratetest.World, nodes ...string) { runtimeOnly(t, w, nodes...) }
	noImages := func(t *testing.T, w *migratetest.World, rec *report.Record) {
		t.Helper()
		w.Mu.Lock()
		defer w.Mu.Unlock()
		calls := strings.Join(w.Calls, "\n")
		if strings.Contains(calls, "push") || len(rec.Images) != 0 || len(w.Images) != 0 {
			t.Errorf("an image was made: %v\n%s", rec.Images, calls)
		}
		if len(w.Staged) != 0 {
			t.Errorf("left staged: %v", w.Staged)
		}
	}

	w := migratetest.NewStatefulSetWorld(t)
	runtimeOn(w, "node-b")
	cfg := stsConfig(migrate.MS2M, migrate.Sequential)
	if _, err := migrate.Run(ctx, cfg, w.Deps(), migrate.Hooks{}); err == nil || !strings.Contains(err.Error(), "kubectl migrate node-setup node-a") {
		t.Fatalf("want a refusal naming node-setup node-a, got %v", err)
	}

	for _, tc := range []struct {
		strategy migrate.Strategy
		mode     migrate.StatefulSetMode
		failures []report.PhaseName // each failed at its last run
	}{
		{migrate.MS2M, migrate.Sequential, []report.PhaseName{report.Restore, report.Replay}},
		{migrate.StopAndCopy, migrate.Sequential, []report.PhaseName{report.Adopt}},
		{migrate.MS2M, migrate.Shadow, []report.PhaseName{report.Replay}},
	} {
		name := string(tc.strategy) + "/" + string(tc.mode)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			w := migratetest.NewStatefulSetWorld(t)
			runtimeOn(w, "node-a", "node-b")
			other := consumer1(t, w)
			rec, err := migrate.Run(ctx, stsConfig(tc.strategy, tc.mode), w.Deps(), migrate.Hooks{})
			if err != nil || rec.Restore != string(migrate.RestoreRuntime) {
				t.Fatalf("%v, restore %q", err, rec.Restore)
			}
			checkStatefulSet(t, w, "node-b", other)
			noImages(t, w, rec)
			pod, _ := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-0", metav1.GetOptions{})
			if pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != ociruntime.HandlerName {
				t.Fatalf("consumer-0 not restored through the runtime: %+v", pod.Spec)
			}
			// Staged before the pod that keeps the name existed, the
			// checkpoint is given to that pod's UID only once it does.
			bound := "bind " + agent.StagedPath(ociruntime.Identity{Namespace: "default", Pod: "consumer-0", Container: "app"}) + " to " + string(pod.UID) + " on node-b"
			if calls := strings.Join(w.Calls, "\n"); tc.mode == migrate.Sequential && (pod.UID == "" || !strings.Contains(calls, bound)) {
				t.Fatalf("want %q in:\n%s", bound, calls)
			}
		})
		for _, failed := range tc.failures {
			t.Run(name+"/rollback/"+string(failed), func(t *testing.T) {
				t.Parallel()
				w := migratetest.NewStatefulSetWorld(t)
				runtimeOn(w, "node-a", "node-b")
				nth := 1
				if tc.mode == migrate.Shadow {
					nth = 2 // the final stage's, after the handover
				}
				if failed == report.Adopt {
					nth = 0
				}
				w.FailOn(failed, nth)
				other := consumer1(t, w)
				rec, err := migrate.Run(ctx, stsConfig(tc.strategy, tc.mode), w.Deps(), migrate.Hooks{})
				if err == nil || rec.Outcome != report.RolledBack {
					t.Fatalf("want a rolled-back migration, got %v (%s)", err, rec.Outcome)
				}
				w.FailOn("", 0)
				checkStatefulSet(t, w, "node-a", other)
				noImages(t, w, rec)
				if calls := strings.Join(w.Calls, "\n"); !strings.Contains(calls, "send to 192.0.2.") {
					t.Fatalf("nothing sent node to node:\n%s", calls)
				}
			})
		}
	}
}
