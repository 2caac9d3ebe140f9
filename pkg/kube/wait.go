// Package kube holds the small Kubernetes helpers the engine shares: waiting
// on a pod through a watch, and deleting it.
package kube

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// pullFailures are the waiting reasons of a container whose image the node
// cannot pull.
var pullFailures = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true}

// PullFailed reports whether a container waits because its image cannot be
// pulled.
func PullFailed(w *corev1.ContainerStateWaiting) bool { return w != nil && pullFailures[w.Reason] }

// StartFailed reports whether a container waits for something that will not
// come on its own: its image cannot be pulled, or it cannot be created, or it
// keeps crashing.
func StartFailed(w *corev1.ContainerStateWaiting) bool {
	if w == nil {
		return false
	}
	switch w.Reason {
	case "CreateContainerError", "CreateContainerConfigError", "CrashLoopBackOff":
		return true
	}
	return pullFailures[w.Reason]
}

// ContainersRunning holds once every named container of the pod runs, and
// fails fast on states that will not get there on their own; what names
// the pod in errors ("restored " gives "the restored pod …", "restored
// container …").
func ContainersRunning(what string, names []string) PodCondition {
	return func(pod *corev1.Pod) (bool, error) {
		if pod == nil {
			return false, fmt.Errorf("the %spod was deleted", what)
		}
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("the %spod ended (%s): %s", what, pod.Status.Phase, pod.Status.Message)
		}
		running := 0
		for _, cs := range pod.Status.ContainerStatuses {
			if !slices.Contains(names, cs.Name) {
				continue
			}
			switch {
			case cs.State.Running != nil:
				running++
			case cs.State.Terminated != nil:
				return false, fmt.Errorf("%scontainer %s exited: %s %s", what, cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.Message)
			case StartFailed(cs.State.Waiting):
				return false, fmt.Errorf("%scontainer %s: %s: %s", what, cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			}
		}
		return running == len(names), nil
	}
}

// PodCondition decides from a pod's latest state whether waiting is over;
// a non-nil error ends the wait with that error. pod is nil once deleted.
type PodCondition func(pod *corev1.Pod) (bool, error)

// WaitForPod watches one pod until cond holds or ctx ends.
func WaitForPod(ctx context.Context, client kubernetes.Interface, namespace, name string, cond PodCondition) (*corev1.Pod, error) {
	selector := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return client.CoreV1().Pods(namespace).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return client.CoreV1().Pods(namespace).Watch(ctx, o)
		},
	}, client)
	var last *corev1.Pod
	precondition := func(store cache.Store) (bool, error) {
		if _, exists, err := store.GetByKey(namespace + "/" + name); err != nil || exists {
			return false, err
		}
		return cond(nil) // absent from the start
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, precondition, func(ev watch.Event) (bool, error) {
		if obj, ok := ev.Object.(*corev1.Pod); !ok || obj.Name != name {
			return false, nil // not every client honours the field selector
		}
		switch ev.Type {
		case watch.Deleted:
			last = nil
			return cond(nil)
		case watch.Added, watch.Modified:
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				return false, nil
			}
			last = pod
			return cond(pod)
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil {
		return last, fmt.Errorf("waiting for pod %s/%s: %w", namespace, name, ctx.Err())
	}
	return last, err
}

// Gone is a PodCondition that holds once the pod no longer exists.
func Gone(pod *corev1.Pod) (bool, error) { return pod == nil, nil }

// DeleteAndWait deletes a pod (if it exists) and waits until it is gone.
func DeleteAndWait(ctx context.Context, client kubernetes.Interface, namespace, name string, grace *int64) error {
	err := client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: grace})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", namespace, name, err)
	}
	_, err = WaitForPod(ctx, client, namespace, name, Gone)
	return err
}
