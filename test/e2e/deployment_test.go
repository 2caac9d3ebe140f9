//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// deploymentLab is a Deployment of two sample consumers on node-a, each on
// its own queue (work-ID-<its pod's name>) of one fanout exchange, fed by one
// producer, and a record of every pod created in its namespace.
type deploymentLab struct {
	*lab
	ns, id string
	w      *workload.Workload // the producer's; queue of pods[0]
	pods   []string           // the ReplicaSet's pods, as first created
	d      *appsv1.Deployment
	rs     *appsv1.ReplicaSet

	mu      sync.Mutex
	created []*corev1.Pod // every pod created in the namespace since the start
}

// startDeployment deploys it, changed by changes, and waits until both
// consumers applied some messages.
func (l *lab) startDeployment(t testing.TB, changes ...func(*appsv1.Deployment)) *deploymentLab {
	ctx := context.Background()
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	dl := &deploymentLab{lab: l, ns: "e2e-deploy-" + id, id: id}
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: dl.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	exchange := "ms2m-" + id
	t.Cleanup(func() {
		if t.Failed() && dl.w != nil {
			l.dumpDiagnostics(t, dl.w)
		}
		_ = l.client.CoreV1().Namespaces().Delete(context.Background(), dl.ns, metav1.DeleteOptions{})
	})
	l.waitDefaultServiceAccount(t, dl.ns)
	if _, err := workload.CreateControlToken(ctx, l.client, dl.ns); err != nil {
		t.Fatal(err)
	}
	dl.watchCreatedPods(t)
	selector := map[string]string{"app": "consumer"}
	queue := "work-" + id + "-$(POD_NAME)"
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: dl.ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: selector, Annotations: map[string]string{
					"ms2m.io/broker-url": l.brokerURL, "ms2m.io/exchange": exchange, "ms2m.io/queue": queue,
					"ms2m.io/registry": l.registry + "/checkpoints",
				}},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": "node-a"},
					Containers: []corev1.Container{{
						Name: "consumer", Image: l.imagePrefix + "/ms2m-consumer:lab", ImagePullPolicy: corev1.PullAlways,
						Env:   []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
						Args:  []string{"--url=" + l.brokerURL, "--exchange=" + exchange, "--queue=" + queue, "--work=50ms"},
						Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
					}},
				},
			},
		},
	}
	workload.AddProbes(&d.Spec.Template.Spec.Containers[0])
	workload.MountControlToken(&d.Spec.Template.Spec)
	for _, change := range changes {
		change(d)
	}
	if _, err := l.client.AppsV1().Deployments(dl.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := l.client.AppsV1().Deployments(dl.ns).Get(ctx, "consumer", metav1.GetOptions{})
		return err == nil && d.Status.ObservedGeneration == d.Generation && d.Status.ReadyReplicas == 2 && d.Status.UpdatedReplicas == 2 && d.Status.Replicas == 2, nil
	}); err != nil {
		t.Fatalf("the Deployment never became ready: %v", err)
	}
	dl.d, dl.rs = dl.read(t)
	dl.pods = dl.rsPods(t)
	dl.startAutoscaler(t)
	dl.w = workload.Attach(l.client, dl.ns, exchange, dl.queueOf(dl.pods[0]))
	producer := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "producer", Namespace: dl.ns, Labels: workload.ProducerLabels()},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{
			Name: "producer", Image: l.imagePrefix + "/ms2m-producer:lab", ImagePullPolicy: corev1.PullAlways,
			Args:  []string{"--url=" + l.brokerURL, "--exchange=" + exchange, "--queue=" + dl.w.Queue, "--rate=10"},
			Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
		}}},
	}
	workload.MountControlToken(&producer.Spec)
	if _, err := l.client.CoreV1().Pods(dl.ns).Create(ctx, producer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, pod := range dl.pods {
		waitApplied(t, dl.w, pod, 20)
	}
	return dl
}

// startAutoscaler puts a HorizontalPodAutoscaler (2 to 4 replicas) on the
// Deployment and waits until the controller has read its scale: a
// migration must leave what it reads — the Deployment's scale and its
// pods — as it was, so it never scales (checkUnchanged). The lab has no
// metrics server, so it could not scale on load either: what is proven is
// that a migration gives it nothing to act on.
func (dl *deploymentLab) startAutoscaler(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: dl.ns},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "consumer"},
			MinReplicas:    ptr.To[int32](2), MaxReplicas: 4,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](80)},
			}}},
		},
	}
	if _, err := dl.client.AutoscalingV2().HorizontalPodAutoscalers(dl.ns).Create(ctx, hpa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		h, err := dl.client.AutoscalingV2().HorizontalPodAutoscalers(dl.ns).Get(ctx, "consumer", metav1.GetOptions{})
		return err == nil && h.Status.CurrentReplicas == 2, nil
	}); err != nil {
		t.Fatalf("the HorizontalPodAutoscaler never read the Deployment's scale: %v", err)
	}
}

// checkAutoscaler: the HorizontalPodAutoscaler still sees 2 replicas and
// never scaled.
func (dl *deploymentLab) checkAutoscaler(t testing.TB) {
	t.Helper()
	h, err := dl.client.AutoscalingV2().HorizontalPodAutoscalers(dl.ns).Get(context.Background(), "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Status.CurrentReplicas != 2 || h.Status.LastScaleTime != nil || (h.Status.DesiredReplicas != 0 && h.Status.DesiredReplicas != 2) {
		t.Fatalf("the HorizontalPodAutoscaler was disturbed: %+v", h.Status)
	}
}

func (dl *deploymentLab) queueOf(pod string) string { return "work-" + dl.id + "-" + pod }

// watchCreatedPods records every pod created in the namespace until the
// test ends.
func (dl *deploymentLab) watchCreatedPods(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	w, err := dl.client.CoreV1().Pods(dl.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				dl.mu.Lock()
				dl.created = append(dl.created, pod)
				dl.mu.Unlock()
			}
		}
	}()
}

func (dl *deploymentLab) read(t testing.TB) (*appsv1.Deployment, *appsv1.ReplicaSet) {
	t.Helper()
	ctx := context.Background()
	d, err := dl.client.AppsV1().Deployments(dl.ns).Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := dl.client.AppsV1().ReplicaSets(dl.ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("ReplicaSets %v, %v; want one", list, err)
	}
	return d, &list.Items[0]
}

// rsPods lists the ReplicaSet's pods by name.
func (dl *deploymentLab) rsPods(t testing.TB) []string {
	t.Helper()
	list, err := dl.client.CoreV1().Pods(dl.ns).List(context.Background(), metav1.ListOptions{LabelSelector: labels.Set{"app": "consumer"}.String()})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		if owner := metav1.GetControllerOf(&p); owner != nil && owner.UID == dl.rs.UID && p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	slices.Sort(names)
	return names
}

// checkUnchanged checks that the ReplicaSet never created a pod after the
// first two, that it owns exactly the pods of want, each on its node, and that neither it nor
// the Deployment changed (no rollout, same replicas, same template hash).
func (dl *deploymentLab) checkUnchanged(t testing.TB, want map[string]string) {
	t.Helper()
	ctx := context.Background()
	dl.mu.Lock()
	for _, p := range dl.created {
		if owner := metav1.GetControllerOf(p); owner != nil && owner.Kind == "ReplicaSet" && !slices.Contains(dl.pods, p.Name) {
			t.Errorf("the ReplicaSet created pod %s: a cold replacement", p.Name)
		}
	}
	dl.mu.Unlock()
	d, rs := dl.read(t)
	if d.Generation != dl.d.Generation || !reflect.DeepEqual(d.Spec, dl.d.Spec) || rs.UID != dl.rs.UID ||
		rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != dl.rs.Labels[appsv1.DefaultDeploymentUniqueLabelKey] || *rs.Spec.Replicas != 2 {
		t.Fatalf("the Deployment or its ReplicaSet changed: generation %d → %d, replicas %d", dl.d.Generation, d.Generation, *rs.Spec.Replicas)
	}
	dl.checkAutoscaler(t)
	// The ReplicaSet settles (a source it deleted is gone) within a poll.
	names := slices.Sorted(maps.Keys(want))
	var got []string
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		got = dl.rsPods(t)
		return slices.Equal(got, names), nil
	})
	if !slices.Equal(got, names) {
		t.Fatalf("ReplicaSet pods %v, want %v", got, names)
	}
	for name, node := range want {
		pod, err := dl.client.CoreV1().Pods(dl.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || pod.Spec.NodeName != node {
			t.Fatalf("pod %s: %v; want it on %s", name, err, node)
		}
	}
}

// conserve checks that every consumer, each under the pod it lives in now
// (consumers[i] carries the queue of dl.pods[i]), applied every message once.
func (dl *deploymentLab) conserve(t testing.TB, consumers []string) {
	t.Helper()
	got, sent, err := dl.w.CheckConservation(context.Background(), consumers[0])
	if err != nil {
		t.Fatal(err)
	}
	other, err := dl.w.WaitApplied(context.Background(), consumers[1], sent.LastSeq, time.Minute)
	if err != nil || !other.Totals.Equal(sent.Totals) {
		t.Fatalf("%s applied %+v, sent %+v (%v)", consumers[1], other.Totals, sent.Totals, err)
	}
	t.Logf("conservation: %d sent; %s and %s each applied all exactly once (digest %s)", sent.Totals.Count, consumers[0], consumers[1], got.Totals.Digest)
}

// TestDeploymentPodsMigrate moves both pods of a Deployment to node-b, one
// with MS2M and one with stop-and-copy, and the first back again (a
// restored copy keeps its first pod's queue), while a watch on the
// namespace sees every pod created: the ReplicaSet must never start a cold
// replacement, must end owning the restored pods, and the Deployment must
// not roll out; every message is applied once by each consumer.
func TestDeploymentPodsMigrate(t *testing.T) {
	concurrent(t)
	l := setup(t)
	dl := l.startDeployment(t)
	var moved []string
	for i, strategy := range []string{"ms2m", "stop-and-copy"} {
		before := state(t, dl.w, dl.pods[i])
		rec, stderr, err := l.migrate(t, dl.w, "pod", dl.pods[i], "--to", "node-b", "--strategy", strategy)
		if err != nil || rec.Outcome != report.Succeeded {
			t.Fatalf("%s migration of %s: %v %s\n%s", strategy, dl.pods[i], err, rec.Outcome, stderr)
		}
		if after := state(t, dl.w, rec.TargetPod); after.Process != before.Process || after.Mode != protocol.ModePrimary {
			t.Fatalf("%s was not restored from %s's checkpoint: before %+v after %+v", rec.TargetPod, dl.pods[i], before, after)
		}
		l.queuesGone(t, protocol.ReplayQueueName(dl.queueOf(dl.pods[i])))
		moved = append(moved, rec.TargetPod)
	}
	rec, stderr, err := l.migrate(t, dl.w, "pod", moved[0], "--to", "node-a")
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("migration of %s back: %v %s\n%s", moved[0], err, rec.Outcome, stderr)
	}
	l.queuesGone(t, protocol.ReplayQueueName(dl.queueOf(dl.pods[0])))
	moved[0] = rec.TargetPod
	dl.checkUnchanged(t, map[string]string{moved[0]: "node-a", moved[1]: "node-b"})
	dl.conserve(t, moved)
}

// TestDeploymentPodRollsBack fails a Deployment pod's migration during
// replay: the copy goes, the source serves on, the ReplicaSet is as it was
// and made no pod, and nothing is lost.
func TestDeploymentPodRollsBack(t *testing.T) {
	concurrent(t)
	l := setup(t)
	dl := l.startDeployment(t)
	rec, stderr, err := l.migrate(t, dl.w, "pod", dl.pods[0], "--to", "node-b", "--inject-failure", "replay")
	if err == nil || rec.Outcome != report.RolledBack {
		t.Fatalf("want a rolled-back migration, got %v %s\n%s", err, rec.Outcome, stderr)
	}
	if st := state(t, dl.w, dl.pods[0]); st.Mode != protocol.ModePrimary {
		t.Fatalf("%s does not consume its queue after the rollback: %+v", dl.pods[0], st)
	}
	dl.checkUnchanged(t, map[string]string{dl.pods[0]: "node-a", dl.pods[1]: "node-a"})
	dl.conserve(t, dl.pods)
}
