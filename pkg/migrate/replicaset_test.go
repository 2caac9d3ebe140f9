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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// replicaSetBefore is the Deployment and ReplicaSet as they were before.
type replicaSetBefore struct {
	d  *appsv1.Deployment
	rs *appsv1.ReplicaSet
}

func readReplicaSet(t *testing.T, w *migratetest.World) replicaSetBefore {
	t.Helper()
	ctx := context.Background()
	d, err := w.Client.AppsV1().Deployments("default").Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := w.Client.AppsV1().ReplicaSets("default").Get(ctx, migratetest.ReplicaSetName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return replicaSetBefore{d, rs}
}

// checkReplicaSet checks that the ReplicaSet never made a pod afresh, that
// it owns exactly want (and consumer-other), each with all its labels, and
// that neither it nor the Deployment changed.
func checkReplicaSet(t *testing.T, w *migratetest.World, before replicaSetBefore, want string) {
	t.Helper()
	for _, c := range w.Changes() {
		if strings.Contains(c, "afresh") {
			t.Fatalf("the ReplicaSet started a cold replacement: %s", c)
		}
	}
	after := readReplicaSet(t, w)
	if after.d.Generation != before.d.Generation || !reflect.DeepEqual(after.d.Spec, before.d.Spec) || !reflect.DeepEqual(after.rs.Spec, before.rs.Spec) {
		t.Fatalf("Deployment or ReplicaSet changed")
	}
	pods, err := w.Client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
		owner := metav1.GetControllerOf(&p)
		if owner == nil || owner.Name != migratetest.ReplicaSetName || p.Labels["app"] != "consumer" || p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != migratetest.PodTemplateHash {
			t.Errorf("pod %s: owner %+v, labels %v", p.Name, owner, p.Labels)
		}
	}
	if slices.Sort(names); !slices.Equal(names, []string{want, "consumer-other"}) {
		t.Fatalf("pods %v, want %s and consumer-other", names, want)
	}
}

// TestReplicaSetPodMigrates: a Deployment's pod moves with every strategy;
// its copy is not the ReplicaSet's (nor selected by it) until the source has
// stopped and the copy serves; then the ReplicaSet adopts the copy and the
// source goes, without a cold replacement ever being made.
func TestReplicaSetPodMigrates(t *testing.T) {
	t.Parallel()
	for _, strategy := range migrate.Strategies {
		t.Run(string(strategy), func(t *testing.T) {
			w := migratetest.NewReplicaSetWorld(t)
			before := readReplicaSet(t, w)
			// What the copy looks like while it replays.
			var replaying *corev1.Pod
			hooks := migrate.Hooks{PhaseFinished: func(p report.PhaseTiming, _ time.Duration, _ error) {
				if p.Name == report.Restore {
					replaying, _ = w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{})
				}
			}}
			rec, err := migrate.Run(context.Background(), testConfig(strategy), w.Deps(), hooks)
			if err != nil || rec.Outcome != report.Succeeded {
				t.Fatalf("%v %s", err, rec.Outcome)
			}
			if replaying == nil || replaying.Labels["app"] != "" || replaying.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != "" || metav1.GetControllerOf(replaying) != nil {
				t.Fatalf("the copy was visible to the ReplicaSet before it took over: %+v", replaying)
			}
			checkReplicaSet(t, w, before, "consumer-abcde")
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
			order := strings.Join(w.Changes(), "\n")
			switchover := map[migrate.Strategy]string{
				migrate.MS2M: "control consumer-abcde END_REPLAY", migrate.StopAndCopy: "control consumer-abcde RESUME",
				// Nothing to tell the copy: it is adopted after its source was cut off.
				migrate.CheckpointRestore: "fence consumer on node-a (lift false)",
			}[strategy]
			if i, j := strings.Index(order, switchover), strings.Index(order, "replicaset adopted consumer-abcde"); i < 0 || j < i {
				t.Fatalf("adopted before the switchover:\n%s", order)
			}
		})
	}
}

// TestReplicaSetPodRollsBack: a migration that fails before the switchover
// leaves the ReplicaSet exactly as it was, the copy gone.
func TestReplicaSetPodRollsBack(t *testing.T) {
	t.Parallel()
	for _, phase := range []report.PhaseName{report.Checkpoint, report.Restore, report.Replay, report.Switchover} {
		t.Run(string(phase), func(t *testing.T) {
			w := migratetest.NewReplicaSetWorld(t)
			before := readReplicaSet(t, w)
			w.FailAt = phase
			rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
			if err == nil || rec.Outcome != report.RolledBack {
				t.Fatalf("%v %s", err, rec.Outcome)
			}
			checkReplicaSet(t, w, before, "consumer")
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
			if order := strings.Join(w.Changes(), "\n"); strings.Contains(order, "replicaset") {
				t.Fatalf("the ReplicaSet acted:\n%s", order)
			}
		})
	}
}

// TestReplicaSetPreflightRefusals: a pod whose controller is about to
// replace it, or one that cannot be hidden from its ReplicaSet, is refused
// before anything changes.
func TestReplicaSetPreflightRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	deployment := func(change func(*appsv1.Deployment)) func(*migratetest.World) {
		return func(w *migratetest.World) {
			d, _ := w.Client.AppsV1().Deployments("default").Get(ctx, "consumer", metav1.GetOptions{})
			change(d)
			_, _ = w.Client.AppsV1().Deployments("default").Update(ctx, d, metav1.UpdateOptions{})
		}
	}
	replicaSet := func(change func(*appsv1.ReplicaSet)) func(*migratetest.World) {
		return func(w *migratetest.World) {
			rs, _ := w.Client.AppsV1().ReplicaSets("default").Get(ctx, migratetest.ReplicaSetName, metav1.GetOptions{})
			change(rs)
			_, _ = w.Client.AppsV1().ReplicaSets("default").Update(ctx, rs, metav1.UpdateOptions{})
		}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*migratetest.World)
		want   string
	}{
		{"paused", deployment(func(d *appsv1.Deployment) { d.Spec.Paused = true }), "the Deployment consumer is paused"},
		{"rolling out", deployment(func(d *appsv1.Deployment) { d.Status.UpdatedReplicas = 1 }), "rolling out or scaling (1 of 2 pods updated"},
		{"new generation", deployment(func(d *appsv1.Deployment) { d.Generation = 2 }), "wait for kubectl rollout status deployment/consumer"},
		{"scaling", replicaSet(func(rs *appsv1.ReplicaSet) { rs.Status.Replicas = 1 }), "is scaling (1 pods of 2)"},
		{"other controller", replicaSet(func(rs *appsv1.ReplicaSet) {
			rs.OwnerReferences[0].Kind, rs.OwnerReferences[0].Name = "Rollout", "canary"
		}), "controlled by Rollout canary"},
		{"selector by absence", replicaSet(func(rs *appsv1.ReplicaSet) {
			rs.OwnerReferences = nil
			rs.Spec.Selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"web"}}}}
		}), "requires no label"},
		{"a Job's pod", func(w *migratetest.World) {
			p, _ := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{})
			p.OwnerReferences[0].Kind, p.OwnerReferences[0].Name = "Job", "batch"
			_, _ = w.Client.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{})
		}, "controlled by Job batch, which would replace it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := migratetest.NewReplicaSetWorld(t)
			tc.mutate(w)
			calls := len(w.Changes())
			_, err := migrate.Run(ctx, testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if changes := w.Changes()[calls:]; len(changes) != 0 || len(w.Records()) != 0 || len(w.Leases()) != 0 {
				t.Fatalf("preflight changed something: %v", changes)
			}
		})
	}
}

// TestRecoverReplicaSetPodFromACrashAtEveryStep: killed at any step and
// recovered, a Deployment's pod ends on one node or the other, the
// ReplicaSet's, with no cold replacement made and every message once.
func TestRecoverReplicaSetPodFromACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	for _, strategy := range migrate.Strategies {
		steps := crashSteps(t, migratetest.NewReplicaSetWorld, testConfig(strategy))
		for n := 1; n <= steps; n++ {
			t.Run(fmt.Sprintf("%s/%d", strategy, n), func(t *testing.T) {
				t.Parallel()
				w := migratetest.NewReplicaSetWorld(t)
				before := readReplicaSet(t, w)
				_, rec := crashAndRecover(t, w, testConfig(strategy), n)
				want := "consumer"
				if rec.Outcome == report.Succeeded {
					want = "consumer-abcde"
				}
				checkReplicaSet(t, w, before, want)
			})
		}
	}
}

// TestReplicaSetOneOverIsWaitedOut: a ReplicaSet one pod over (another
// migration's source on its way out) is waited for, not refused.
func TestReplicaSetOneOverIsWaitedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := migratetest.NewReplicaSetWorld(t)
	setStatus := func(n int32) {
		rs, _ := w.Client.AppsV1().ReplicaSets("default").Get(ctx, migratetest.ReplicaSetName, metav1.GetOptions{})
		rs.Status.Replicas = n
		_, _ = w.Client.AppsV1().ReplicaSets("default").UpdateStatus(ctx, rs, metav1.UpdateOptions{})
	}
	setStatus(3)
	settled := time.AfterFunc(time.Second, func() { setStatus(2) })
	defer settled.Stop()
	rec, err := migrate.Run(ctx, testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("%v %s", err, rec.Outcome)
	}
	if p := rec.Phases[0]; p.DurationMillis < 900 {
		t.Fatalf("preflight took %d ms: it did not wait for the ReplicaSet", p.DurationMillis)
	}
}
