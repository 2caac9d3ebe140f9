//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// deployStatefulSet runs a 2-replica consumer StatefulSet on node-a, each
// ordinal with its own queue bound to one fanout exchange, and one producer;
// with changes applied to the StatefulSet before it is created.
func (l *lab) deployStatefulSet(t testing.TB, changes ...func(ns string, sts *appsv1.StatefulSet)) (*workload.Workload, *appsv1.StatefulSet) {
	return l.deployStatefulSetAt(t, "10", changes...)
}

// deployStatefulSetAt is deployStatefulSet with the producer at rate msg/s.
func (l *lab) deployStatefulSetAt(t testing.TB, rate string, changes ...func(ns string, sts *appsv1.StatefulSet)) (*workload.Workload, *appsv1.StatefulSet) {
	ctx := context.Background()
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	ns, exchange := "e2e-sts-"+id, "ms2m-"+id
	queueOf := func(pod string) string { return "work-" + id + "-" + pod }
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := workload.Attach(l.client, ns, exchange, queueOf("consumer-0"))
	t.Cleanup(func() {
		if t.Failed() {
			l.dumpDiagnostics(t, w)
		}
		_ = w.Delete(context.Background())
	})
	l.waitDefaultServiceAccount(t, ns)
	if _, err := workload.CreateControlToken(ctx, l.client, ns); err != nil {
		t.Fatal(err)
	}
	// A mounted volume must follow the pod: the runtime restores a container
	// only with the mounts it was checkpointed with.
	config := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "consumer-config", Namespace: ns}, Data: map[string]string{"work": "50ms"}}
	if _, err := l.client.CoreV1().ConfigMaps(ns).Create(ctx, config, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "consumer"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](2), ServiceName: "consumer", PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{
					"ms2m.io/broker-url": l.brokerURL, "ms2m.io/exchange": exchange, "ms2m.io/registry": l.registry + "/checkpoints",
				}},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": "node-a"},
					Containers: []corev1.Container{{
						Name: "consumer", Image: l.imagePrefix + "/ms2m-consumer:lab", ImagePullPolicy: corev1.PullAlways,
						Env:          []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
						Args:         []string{"--url=" + l.brokerURL, "--exchange=" + exchange, "--queue=work-" + id + "-$(POD_NAME)", "--work=50ms"},
						Ports:        []corev1.ContainerPort{{ContainerPort: 8080}},
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/consumer"}},
					}},
					Volumes: []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
						LocalObjectReference: corev1.LocalObjectReference{Name: "consumer-config"}}}}},
				},
			},
		},
	}
	workload.AddProbes(&sts.Spec.Template.Spec.Containers[0])
	workload.MountControlToken(&sts.Spec.Template.Spec)
	for _, change := range changes {
		change(ns, sts)
	}
	created, err := l.client.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range []string{"consumer-0", "consumer-1"} {
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := w.State(ctx, pod)
			return err == nil, nil
		}); err != nil {
			t.Fatalf("%s never answered: %v", pod, err)
		}
	}
	producer := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "producer", Namespace: ns, Labels: workload.ProducerLabels()},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{
			Name: "producer", Image: l.imagePrefix + "/ms2m-producer:lab", ImagePullPolicy: corev1.PullAlways,
			Args:  []string{"--url=" + l.brokerURL, "--exchange=" + exchange, "--queue=" + queueOf("consumer-0"), "--rate=" + rate},
			Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
		}}},
	}
	workload.MountControlToken(&producer.Spec)
	if _, err := l.client.CoreV1().Pods(ns).Create(ctx, producer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return w, created
}

func TestStatefulSetSequential(t *testing.T) {
	concurrent(t)
	migrateStatefulSet(t, nil, "--strategy", "ms2m")
}

func TestStatefulSetStopAndCopy(t *testing.T) {
	concurrent(t)
	migrateStatefulSet(t, nil, "--strategy", "stop-and-copy")
}

// TestStatefulSetShadow moves the pod through a shadow copy: two MS2M
// switchovers instead of sequential mode's restore-long gap.
func TestStatefulSetShadow(t *testing.T) {
	concurrent(t)
	rec := migrateStatefulSet(t, nil, "--mode", "shadow")
	sh := rec.Shadow
	if rec.Mode != "shadow" || sh == nil || sh.Pod != "consumer-0-shadow" || rec.Downtime.Millis != sh.ToShadowMillis+sh.ToFinalMillis {
		t.Fatalf("shadow record %+v downtime %+v", sh, rec.Downtime)
	}
	t.Logf("shadow gaps: source → shadow %d ms, shadow → final %d ms", sh.ToShadowMillis, sh.ToFinalMillis)
}

// migrateStatefulSet moves ordinal 0 of a 2-replica StatefulSet (changed by
// change, if not nil) to node-b and checks identity, adoption, state
// continuity, conservation, that ordinal 1 was untouched, that no shadow is
// left, and that a later rollout works.
func migrateStatefulSet(t *testing.T, change func(ns string, sts *appsv1.StatefulSet), flags ...string) report.Record {
	l := setup(t)
	ctx := context.Background()
	var changes []func(string, *appsv1.StatefulSet)
	if change != nil {
		changes = append(changes, change)
	}
	b := l.startStatefulSet(t, 30, changes...)
	w := b.w
	rec, stderr, err := l.migrate(t, w, append([]string{"sts", "consumer-0", "--to", "node-b", "--queue", w.Queue}, flags...)...)
	if err != nil {
		t.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	if rec.Outcome != report.Succeeded || rec.TargetPod != "consumer-0" {
		t.Fatalf("record %+v", rec)
	}
	pod, st := l.checkStatefulSetAfter(t, b, "node-b")
	if !runtimeRestored(pod) && !strings.HasPrefix(pod.Spec.Containers[0].Image, l.registry+"/checkpoints/"+b.w.Namespace+"/") {
		t.Fatalf("consumer-0 runs %s, not its checkpoint", pod.Spec.Containers[0].Image)
	}
	if mounts := pod.Spec.Containers[0].VolumeMounts; !slices.ContainsFunc(mounts, func(m corev1.VolumeMount) bool { return m.Name == "config" && m.MountPath == "/etc/consumer" }) {
		t.Fatalf("consumer-0 lost its config volume: %+v", mounts)
	}
	if st.Totals.Count < b.state0.Totals.Count {
		t.Fatalf("consumer-0 lost state: before %+v after %+v", b.state0, st)
	}

	// Ordinal 0 saw every message exactly once; so did the untouched ordinal 1.
	got, sent := checkOrdinalsConserve(t, w)
	t.Logf("conservation: %d sent; consumer-0 (moved) and consumer-1 (untouched) each applied all exactly once (digest %s, consumer-0's state %s); downtime %d ms of %d ms",
		sent.Totals.Count, got.Totals.Digest, got.App, rec.Downtime.Millis, rec.TotalMillis)

	// A later rollout still works: the controller replaces both pods.
	patch := []byte(`{"spec":{"template":{"metadata":{"annotations":{"e2e/rollout":"1"}}}}}`)
	if _, err := l.client.AppsV1().StatefulSets(w.Namespace).Patch(ctx, "consumer", types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := l.client.AppsV1().StatefulSets(w.Namespace).Get(ctx, "consumer", metav1.GetOptions{})
		return err == nil && s.Status.ObservedGeneration == s.Generation && s.Status.UpdatedReplicas == 2 &&
			s.Status.ReadyReplicas == 2 && s.Status.CurrentRevision == s.Status.UpdateRevision, nil
	})
	if err != nil {
		t.Fatal("rollout after migration did not complete:", err)
	}
	return rec
}

// checkOrdinalsConserve stops the StatefulSet workload's producer and
// checks that both ordinals applied every message it sent exactly once.
func checkOrdinalsConserve(t testing.TB, w *workload.Workload) (protocol.State, ms2m.ProducerState) {
	t.Helper()
	got, sent, err := w.CheckConservation(context.Background(), "consumer-0")
	if err != nil {
		t.Fatal(err)
	}
	one, err := w.WaitApplied(context.Background(), "consumer-1", sent.LastSeq, time.Minute)
	if err != nil || !one.Totals.Equal(sent.Totals) {
		t.Fatalf("consumer-1 applied %+v, sent %+v (%v)", one.Totals, sent.Totals, err)
	}
	return got, sent
}

// TestStatefulSetRollback fails a StatefulSet migration after the source pod
// was deleted and its copy restored on node-b (replay cannot finish in 1 ms):
// the source must come back on node-a under its name, restored from its
// checkpoint, owned by an unchanged StatefulSet, and lose nothing.
func TestStatefulSetRollback(t *testing.T) {
	concurrent(t)
	rollBackStatefulSet(t, "--replay-timeout", "1ms")
}

// TestStatefulSetShadowRollback fails shadow mode at its last step before
// the final pod takes over: the shadow has served for a while, the source
// pod and the StatefulSet are gone and the final pod has replayed. The
// shadow's state must come back into consumer-0 on node-a.
func TestStatefulSetShadowRollback(t *testing.T) {
	concurrent(t)
	rollBackStatefulSet(t, "--mode", "shadow", "--inject-failure", "replay/final")
}

func rollBackStatefulSet(t *testing.T, flags ...string) report.Record {
	l := setup(t)
	b := l.startStatefulSet(t, 20)
	w := b.w
	rec, stderr, err := l.migrate(t, w, append([]string{"sts", "consumer-0", "--to", "node-b", "--queue", w.Queue}, flags...)...)
	if err == nil || rec.Outcome != report.RolledBack {
		t.Fatalf("want a rolled-back migration, got %v %s\n%s", err, rec.Outcome, stderr)
	}
	if _, st := l.checkStatefulSetAfter(t, b, "node-a"); st.Mode != "primary" {
		t.Fatalf("consumer-0 does not consume its queue after the rollback: %+v", st)
	}
	if _, _, err := w.CheckConservation(context.Background(), "consumer-0"); err != nil {
		t.Fatal(err)
	}
	return rec
}

// statefulSetBefore is a running StatefulSet as it was before a migration.
type statefulSetBefore struct {
	w      *workload.Workload
	sts    *appsv1.StatefulSet
	other  *corev1.Pod    // consumer-1, which no migration may touch
	state0 protocol.State // consumer-0's application
}

// startStatefulSet deploys the StatefulSet and waits until consumer-0 has
// applied message applied.
func (l *lab) startStatefulSet(t *testing.T, applied uint64, changes ...func(ns string, sts *appsv1.StatefulSet)) statefulSetBefore {
	w, sts := l.deployStatefulSet(t, changes...)
	state0 := waitApplied(t, w, "consumer-0", applied)
	other, err := l.client.CoreV1().Pods(w.Namespace).Get(context.Background(), "consumer-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return statefulSetBefore{w: w, sts: sts, other: other, state0: state0}
}

// checkStatefulSetAfter checks, after a migration or its rollback, that
// consumer-0 runs on node with its original process, owned by a StatefulSet
// whose spec is unchanged, that consumer-1 was not touched, and that no
// shadow pod or replay queue is left. It returns consumer-0 and its state.
func (l *lab) checkStatefulSetAfter(t *testing.T, b statefulSetBefore, node string) (*corev1.Pod, protocol.State) {
	t.Helper()
	ctx, ns := context.Background(), b.w.Namespace
	pod, err := l.client.CoreV1().Pods(ns).Get(ctx, "consumer-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	after, err := l.client.AppsV1().StatefulSets(ns).Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if owner := metav1.GetControllerOf(pod); pod.Spec.NodeName != node || owner == nil || owner.UID != after.UID {
		t.Fatalf("consumer-0 on %s owned by %+v; want %s, owned by the StatefulSet", pod.Spec.NodeName, owner, node)
	}
	if !reflect.DeepEqual(b.sts.Spec, after.Spec) {
		before, _ := json.Marshal(b.sts.Spec)
		now, _ := json.Marshal(after.Spec)
		t.Fatalf("StatefulSet spec changed:\n%s\n%s", before, now)
	}
	st := state(t, b.w, "consumer-0")
	if st.Process != b.state0.Process {
		t.Fatalf("consumer-0 was not restored from its checkpoint: before %+v after %+v", b.state0, st)
	}
	other, err := l.client.CoreV1().Pods(ns).Get(ctx, "consumer-1", metav1.GetOptions{})
	if err != nil || other.UID != b.other.UID || other.Spec.NodeName != "node-a" || other.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("consumer-1 was touched: %v", err)
	}
	if _, err := l.client.CoreV1().Pods(ns).Get(ctx, "consumer-0-shadow", metav1.GetOptions{}); !isNotFound(err) {
		t.Fatalf("shadow pod left behind: %v", err)
	}
	l.replayQueueGone(t, b.w)
	return pod, st
}

// TestStatefulSetLocalVolumeRefused gives each ordinal a claim bound to a
// local volume on node-a: its data cannot follow, so preflight must refuse
// with one line naming the volume, and change nothing.
func TestStatefulSetLocalVolumeRefused(t *testing.T) {
	concurrent(t)
	l := setup(t)
	ctx := context.Background()
	w, before := l.deployStatefulSet(t, func(ns string, sts *appsv1.StatefulSet) {
		class := "local-" + ns
		// Local volumes bind when their pod is scheduled, as their docs ask:
		// bound at once, two claims can race for the same volume.
		sc := &storagev1.StorageClass{
			ObjectMeta:        metav1.ObjectMeta{Name: class},
			Provisioner:       "kubernetes.io/no-provisioner",
			VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer),
		}
		if _, err := l.client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = l.client.StorageV1().StorageClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
		})
		for i := range 2 {
			pv := &corev1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", class, i)},
				Spec: corev1.PersistentVolumeSpec{
					Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
					AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					StorageClassName:              class,
					PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
					PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/tmp"}},
					NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
						MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}},
					}}}},
				},
			}
			if _, err := l.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = l.client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
			})
		}
		sts.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{
			ObjectMeta: metav1.ObjectMeta{Name: "data"},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &class,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
			},
		}}
		c := &sts.Spec.Template.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "data", MountPath: "/data"})
	})
	pod, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, "consumer-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, stderr, err := l.migrate(t, w, "sts", "consumer-0", "--to", "node-b", "--queue", w.Queue)
	if err == nil || !strings.Contains(stderr, "PersistentVolumeClaim data-consumer-0 is bound to") ||
		!strings.Contains(stderr, "a local volume at /tmp on node-a whose data cannot follow") {
		t.Fatalf("want a refusal naming the local volume, got %v:\n%s", err, stderr)
	}
	after, err := l.client.AppsV1().StatefulSets(w.Namespace).Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil || after.UID != before.UID {
		t.Fatalf("the StatefulSet was touched: %v", err)
	}
	podAfter, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, "consumer-0", metav1.GetOptions{})
	if err != nil || podAfter.UID != pod.UID || podAfter.Spec.NodeName != "node-a" {
		t.Fatalf("consumer-0 was touched: %v", err)
	}
	if st := state(t, w, "consumer-0"); st.Mode != "primary" || st.PendingRestore {
		t.Fatalf("consumer-0 disturbed: %+v", st)
	}
}
