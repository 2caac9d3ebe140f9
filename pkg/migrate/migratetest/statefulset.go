package migratetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// FreshProcess is the process identity of a pod the fake StatefulSet
// controller created afresh: one that lost its state.
const FreshProcess = "fresh"

// freshAnnotation marks pods the fake controller creates.
const freshAnnotation = "migratetest/fresh"

// StatefulSetUID is the UID of the StatefulSet a NewStatefulSetWorld starts with.
const StatefulSetUID = "sts-uid-1"

// NewStatefulSetWorld returns a world with nodes node-a and node-b and a
// 2-replica StatefulSet default/consumer whose pods consumer-0 (sequence 100)
// and consumer-1 run on node-a, and a fake StatefulSet controller: it adopts
// orphaned members and, like the real one, at once recreates a missing member
// afresh (with FreshProcess) while the StatefulSet exists. FailAt Detach makes
// deleting the StatefulSet fail; FailAt Adopt keeps it from adopting a pod
// on node-b.
func NewStatefulSetWorld(t *testing.T) *World {
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "default", UID: StatefulSetUID},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](2), ServiceName: "consumer",
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "consumer"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "consumer"}}},
		},
	}
	objects := []runtime.Object{Node("node-a", "cri-o://1.34.0"), Node("node-b", "cri-o://1.34.0"), sts}
	for i := range 2 {
		pod := SourcePod()
		pod.Name = fmt.Sprintf("consumer-%d", i)
		if i > 0 {
			pod.UID = types.UID(fmt.Sprintf("source-uid-%d", i)) // each member its own, as the API server gives
		}
		pod.Labels[appsv1.StatefulSetPodNameLabel] = pod.Name
		pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(sts, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}
		objects = append(objects, pod)
	}
	w := NewWorld(t, objects...)
	w.Mu.Lock()
	w.Apps["consumer-0"] = w.Apps["consumer"]
	delete(w.Apps, "consumer")
	w.Apps["consumer-1"] = &protocol.State{Contract: protocol.ContractVersion, Mode: protocol.ModePrimary, LastSeq: 100, Process: "p2", LastAppliedAt: time.Now()}
	w.acked["p2"] = 100
	w.Mu.Unlock()
	created := 1
	w.Client.PrependReactor("create", "statefulsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		created++ // the API server gives every new object its own UID
		a.(k8stesting.CreateAction).GetObject().(*appsv1.StatefulSet).UID = types.UID(fmt.Sprintf("sts-uid-%d", created))
		return false, nil, nil
	})
	w.Client.PrependReactor("delete", "statefulsets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		w.record("delete statefulset")
		if err := w.fail(report.Detach); err != nil {
			return true, nil, err
		}
		// Like the real controller, which ignores a StatefulSet whose
		// deletion has begun, a pass working from an older list must not
		// act for this one any more.
		d := a.(k8stesting.DeleteAction)
		if obj, err := w.Client.Tracker().Get(appsv1.SchemeGroupVersion.WithResource("statefulsets"), d.GetNamespace(), d.GetName()); err == nil {
			w.Mu.Lock()
			w.deletedSets[obj.(*appsv1.StatefulSet).UID] = true
			w.Mu.Unlock()
		}
		return false, nil, nil
	})
	w.startStatefulSetController()
	return w
}

func (w *World) startStatefulSetController() {
	w.runController(w.reconcileStatefulSets, true)
}

// runController runs reconcile on every pod event (and, with statefulSets,
// every StatefulSet event) in the default namespace until the test ends, as
// a controller's informers would.
func (w *World) runController(reconcile func(context.Context), statefulSets bool) {
	ctx, cancel := context.WithCancel(context.Background())
	w.T.Cleanup(cancel)
	podEvents, err := w.Client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	var stsEvents <-chan watch.Event // nil: never ready
	if statefulSets {
		sw, err := w.Client.AppsV1().StatefulSets("default").Watch(ctx, metav1.ListOptions{})
		if err != nil {
			w.T.Fatal(err)
		}
		stsEvents = sw.ResultChan()
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-stsEvents:
			case <-podEvents.ResultChan():
			}
			reconcile(ctx)
		}
	}()
}

func (w *World) reconcileStatefulSets(ctx context.Context) {
	list, err := w.Client.AppsV1().StatefulSets("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
sets:
	for i := range list.Items {
		sts := &list.Items[i]
		for ordinal := range int(*sts.Spec.Replicas) {
			name := fmt.Sprintf("%s-%d", sts.Name, ordinal)
			pod, err := w.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			w.Mu.Lock()
			deleted := w.deletedSets[sts.UID] // checked after the Get: see the delete reactor
			w.Mu.Unlock()
			if deleted {
				continue sets
			}
			if err != nil {
				w.record("statefulset controller created %s afresh", name)
				fresh := SourcePod()
				fresh.Name, fresh.Status = name, corev1.PodStatus{}
				fresh.Annotations = map[string]string{freshAnnotation: "true"}
				fresh.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(sts, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}
				_, _ = w.Client.CoreV1().Pods("default").Create(ctx, fresh, metav1.CreateOptions{})
				continue
			}
			// A controller reference to a StatefulSet that is gone was
			// orphaned (the garbage collector removes it in a real cluster).
			w.Mu.Lock()
			refuse := w.FailAt == report.Adopt && pod.Spec.NodeName == "node-b"
			w.Mu.Unlock()
			if owner := metav1.GetControllerOf(pod); (owner == nil || owner.UID != sts.UID) && !refuse {
				pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(sts, appsv1.SchemeGroupVersion.WithKind("StatefulSet"))}
				_, _ = w.Client.CoreV1().Pods("default").Update(ctx, pod, metav1.UpdateOptions{})
			}
		}
	}
}
