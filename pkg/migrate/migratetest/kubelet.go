package migratetest

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// The world's kubelets: they run, restore and report the pods created on
// their nodes, and checkpoint through the fake kubelet API.

// startKubelet runs pods created on a node: the restored pod comes up with
// the source's application state, as a restore would bring it.
func (w *World) startKubelet() {
	ctx, cancel := context.WithCancel(context.Background())
	w.T.Cleanup(cancel)
	watcher, err := w.Client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	go func() {
		for ev := range watcher.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if ev.Type != watch.Added || !ok || pod.Status.Phase != "" {
				continue
			}
			w.Mu.Lock()
			down := w.KubeletDown[pod.Spec.NodeName]
			w.Mu.Unlock()
			if down {
				continue // it stays pending: no kubelet runs it
			}
			underRuntime := pod.Spec.RuntimeClassName != nil && *pod.Spec.RuntimeClassName == ociruntime.HandlerName
			id := ociruntime.Identity{Namespace: pod.Namespace, Pod: pod.Name, Container: pod.Spec.Containers[0].Name}
			handle := agent.StagedPath(id)
			w.Mu.Lock()
			awaited := w.Expected[agent.ExpectedPath(id)] || w.Staged[handle] && w.BoundTo[handle] == ""
			w.Mu.Unlock()
			if underRuntime && awaited {
				w.reportAddress(ctx, pod)
				// The runtime holds the create until a checkpoint is
				// staged for this pod's UID, or fails it when the mark
				// and the unbound checkpoint go.
				go func() {
					for {
						w.Mu.Lock()
						staged := w.Staged[handle] && w.BoundTo[handle] == pod.UID
						awaited := w.Expected[agent.ExpectedPath(id)] || w.Staged[handle] && w.BoundTo[handle] == ""
						if staged {
							delete(w.Expected, agent.ExpectedPath(id))
						}
						w.Mu.Unlock()
						if staged {
							w.run(ctx, pod, id, underRuntime)
							return
						}
						if !awaited || ctx.Err() != nil {
							return
						}
						time.Sleep(5 * time.Millisecond)
					}
				}()
				continue
			}
			w.run(ctx, pod, id, underRuntime)
		}
	}()
}

// reportAddress reports pod's address once its init containers ended, as
// the kubelet does before it creates the containers the runtime holds.
func (w *World) reportAddress(ctx context.Context, pod *corev1.Pod) {
	if len(pod.Spec.InitContainers) == 0 {
		return
	}
	pod.Status.PodIP = "10.0.0.2"
	state := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}
	if w.InitWaiting != "" {
		state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: w.InitWaiting}}
	}
	for _, c := range pod.Spec.InitContainers {
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, corev1.ContainerStatus{Name: c.Name, State: state})
	}
	if updated, err := w.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err == nil {
		*pod = *updated
	}
}

// run starts pod as its node's runtime would: restored from the checkpoint,
// or afresh.
func (w *World) run(ctx context.Context, pod *corev1.Pod, id ociruntime.Identity, underRuntime bool) {
	state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	staged := agent.StagedPath(id)
	volumes := agent.StagedPath(ociruntime.Identity{Namespace: id.Namespace, Pod: id.Pod, Container: agent.VolumesKey})
	w.Mu.Lock()
	hasCheckpoint := w.Staged[staged] && w.BoundTo[staged] == pod.UID
	if hasCheckpoint || !underRuntime {
		delete(w.Staged, staged) // the runtime claims it, restored or not
		delete(w.BoundTo, staged)
	}
	// The create that restores fills the emptyDir volumes staged by then.
	fills := underRuntime && hasCheckpoint && w.Staged[volumes] && w.BoundTo[volumes] == pod.UID
	if fills {
		delete(w.Staged, volumes)
		delete(w.BoundTo, volumes)
	}
	w.Mu.Unlock()
	if fills {
		w.record("runtime fills the emptyDir volumes of %s", id.Pod)
	}
	switch {
	case pod.Annotations[freshAnnotation] != "" || underRuntime && !hasCheckpoint:
		w.Mu.Lock()
		w.Apps[pod.Name] = &protocol.State{Contract: protocol.ContractVersion, Mode: protocol.ModePrimary, Process: FreshProcess}
		delete(w.restored, pod.Name)
		w.Mu.Unlock()
	case w.fail(report.Restore) != nil:
		state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: "criu failed"}}
	default:
		w.Mu.Lock()
		// Like a real restore: the copy answers first in the mode it
		// was checkpointed in, and holds once it has noticed its dead
		// broker connection (on its first answer here).
		restored := w.snapshot
		w.Apps[pod.Name] = &restored
		w.restored[pod.Name] = true
		if restored.PendingRestore {
			w.reconnecting[pod.Name] = true
		}
		w.Mu.Unlock()
	}
	pod.Status.Phase = corev1.PodRunning
	if state.Running != nil {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	}
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, State: state})
	}
	_, _ = w.Client.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
}

type fakeKubelet World

// Healthy answers as the API server does for a kubelet it cannot reach.
func (f *fakeKubelet) Healthy(_ context.Context, node string) error {
	w := (*World)(f)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if w.KubeletDown[node] {
		return apierrors.NewServiceUnavailable("error trying to reach service: dial tcp " + node + ":10250: connect: connection refused")
	}
	return nil
}

// podsOnDeadKubelets gives pods UIDs (as the API server does) and keeps a
// pod whose node's kubelet is down terminating after a graceful delete,
// since only that kubelet would confirm it; a delete with no grace period
// removes it at once, as on a real cluster.
func (w *World) podsOnDeadKubelets() {
	uids := 0
	w.Client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod); pod.UID == "" {
			uids++ // the fake serialises every action
			pod.UID = types.UID(fmt.Sprintf("uid-%s-%d", pod.Name, uids))
		}
		return false, nil, nil
	})
	w.Client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		del := a.(k8stesting.DeleteAction)
		obj, err := w.Client.Tracker().Get(a.GetResource(), a.GetNamespace(), del.GetName())
		if err != nil {
			return false, nil, nil
		}
		pod := obj.(*corev1.Pod)
		w.Mu.Lock()
		down := w.KubeletDown[pod.Spec.NodeName]
		w.Mu.Unlock()
		if grace := del.GetDeleteOptions().GracePeriodSeconds; !down || grace != nil && *grace == 0 {
			w.Mu.Lock()
			delete(w.Isolated, pod.Name) // a cut holds the pod's network, which goes with it
			w.Mu.Unlock()
			return false, nil, nil
		}
		if pod.DeletionTimestamp == nil {
			pod.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			if err := w.Client.Tracker().Update(a.GetResource(), pod, a.GetNamespace()); err != nil {
				return true, nil, err
			}
		}
		return true, nil, nil
	})
}
