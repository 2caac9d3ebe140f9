package migratetest

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// ReplicaSetName is the ReplicaSet of a NewReplicaSetWorld, owned by
// Deployment "consumer"; its pods carry PodTemplateHash.
const (
	ReplicaSetName  = "consumer-5d8f"
	PodTemplateHash = "5d8f"
)

// NewReplicaSetWorld returns a world with nodes node-a and node-b and a
// 2-replica Deployment default/consumer whose ReplicaSet's pods "consumer"
// (sequence 100, the one to migrate) and "consumer-other" run on node-a, and
// a fake ReplicaSet controller that, like the real one, adopts an orphan its
// selector matches, creates a pod afresh (FreshProcess) when it has too few
// and deletes one when it has too many: a not-ready one first, then the one
// of lowest pod-deletion-cost, then the newest.
func NewReplicaSetWorld(t *testing.T) *World {
	selector := map[string]string{"app": "consumer"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "default", UID: "deploy-uid", Generation: 1},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: selector}},
		},
		Status: appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2},
	}
	rsLabels := map[string]string{"app": "consumer", appsv1.DefaultDeploymentUniqueLabelKey: PodTemplateHash}
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: ReplicaSetName, Namespace: "default", UID: "rs-uid", Generation: 1, Labels: rsLabels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(d, appsv1.SchemeGroupVersion.WithKind("Deployment"))}},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: rsLabels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: rsLabels}},
		},
		Status: appsv1.ReplicaSetStatus{ObservedGeneration: 1, Replicas: 2, ReadyReplicas: 2},
	}
	objects := []runtime.Object{Node("node-a", "cri-o://1.34.0"), Node("node-b", "cri-o://1.34.0"), d, rs}
	for i, name := range []string{"consumer", "consumer-other"} {
		pod := SourcePod()
		pod.Name, pod.Labels = name, map[string]string{"app": "consumer", appsv1.DefaultDeploymentUniqueLabelKey: PodTemplateHash}
		pod.UID = types.UID("uid-" + name) // each pod its own, as the API server gives
		pod.CreationTimestamp = metav1.NewTime(time.Now().Add(time.Duration(i-10) * time.Minute))
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}
		objects = append(objects, pod)
	}
	w := NewWorld(t, objects...)
	w.Mu.Lock()
	w.Apps["consumer-other"] = &protocol.State{Contract: protocol.ContractVersion, Mode: protocol.ModePrimary, LastSeq: 100, Process: "p2", LastAppliedAt: time.Now()}
	w.acked["p2"] = 100
	w.Mu.Unlock()
	w.runController(w.reconcileReplicaSet, false)
	return w
}

func (w *World) reconcileReplicaSet(ctx context.Context) {
	rs, err := w.Client.AppsV1().ReplicaSets("default").Get(ctx, ReplicaSetName, metav1.GetOptions{})
	if err != nil {
		return
	}
	selector, _ := metav1.LabelSelectorAsSelector(rs.Spec.Selector)
	list, err := w.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	var active []corev1.Pod
	for _, pod := range list.Items {
		owner := metav1.GetControllerOf(&pod)
		if pod.DeletionTimestamp != nil || !selector.Matches(labels.Set(pod.Labels)) || owner != nil && owner.UID != rs.UID {
			continue
		}
		if owner == nil {
			w.record("replicaset adopted %s", pod.Name)
			pod.OwnerReferences = append(pod.OwnerReferences, *metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet")))
			if _, err := w.Client.CoreV1().Pods("default").Update(ctx, &pod, metav1.UpdateOptions{}); err != nil {
				continue
			}
		}
		active = append(active, pod)
	}
	switch want := int(*rs.Spec.Replicas); {
	case len(active) < want:
		name := fmt.Sprintf("%s-fresh%d", ReplicaSetName, time.Now().UnixNano()%100000)
		w.record("replicaset controller created %s afresh", name)
		fresh := SourcePod()
		fresh.Name, fresh.Labels, fresh.Status = name, rs.Spec.Template.Labels, corev1.PodStatus{}
		fresh.Annotations = map[string]string{freshAnnotation: "true"}
		fresh.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rs, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}
		_, _ = w.Client.CoreV1().Pods("default").Create(ctx, fresh, metav1.CreateOptions{})
	case len(active) > want:
		victim := slices.MinFunc(active, deleteFirst)
		w.record("replicaset deleted %s", victim.Name)
		_ = w.Client.CoreV1().Pods("default").Delete(ctx, victim.Name, metav1.DeleteOptions{})
	}
}

// deleteFirst orders a ReplicaSet's pods as its controller picks the one to
// delete: not ready, then lowest deletion cost, then newest.
func deleteFirst(a, b corev1.Pod) int {
	ready := func(p corev1.Pod) int {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return 1
			}
		}
		return 0
	}
	cost := func(p corev1.Pod) int {
		c, err := strconv.Atoi(p.Annotations[migrate.DeletionCostAnnotation])
		if err != nil {
			return 0
		}
		return max(c, math.MinInt32)
	}
	return cmp.Or(cmp.Compare(ready(a), ready(b)), cmp.Compare(cost(a), cost(b)), b.CreationTimestamp.Compare(a.CreationTimestamp.Time))
}
