package migrate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// A ReplicaSet's pod (a Deployment's) moves like a bare pod whose copy the
// ReplicaSet does not see until the copy has taken over:
//
//   - the copy is created without the labels the ReplicaSet's and the
//     Deployment's selectors require, so the ReplicaSet neither adopts it
//     nor counts it, and a HorizontalPodAutoscaler does not read it;
//   - after the switchover, once the copy is Ready, the source gets the
//     lowest pod-deletion-cost and the copy its labels back: the ReplicaSet
//     adopts the copy, finds one pod too many and deletes the source (a
//     not-ready pod, then the cheapest, goes first), while the migration
//     deletes it too.
//
// The other order, source first, would leave the ReplicaSet one pod short
// for a moment, and it would start a cold replacement at once. Before the
// switchover nothing of the ReplicaSet's is touched, so a rollback leaves
// it exactly as it was.

// DeletionCostAnnotation is the ReplicaSet controller's hint of which of its
// pods to delete first (the lowest cost).
const DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"

// checkReplicaSet checks, for pod controlled by ReplicaSet name, that the
// ReplicaSet and its Deployment are settled, and learns which labels keep
// the copy out of their selectors. A count one over is a pod on its way out
// (another migration's source, just replaced by its adopted copy): it is
// waited out for up to settleTimeout.
func checkReplicaSet(ctx context.Context, m *Migration, pod *corev1.Pod, name string) error {
	var selectors []*metav1.LabelSelector
	var err error
	_ = wait.PollUntilContextTimeout(ctx, time.Second/2, settleTimeout, true, func(ctx context.Context) (bool, error) {
		selectors, err = replicaSetSettled(ctx, m, name)
		return !errors.Is(err, errSettling), nil
	})
	if err != nil {
		return err
	}
	hidden, err := labelsToHide(pod.Labels, selectors)
	if err != nil {
		return fmt.Errorf("pod %s of ReplicaSet %s: %w", m.config.Pod, name, err)
	}
	m.state.ReplicaSet, m.state.HiddenLabels = name, hidden
	return nil
}

// settleTimeout bounds the wait for a ReplicaSet whose count is one over.
const settleTimeout = 30 * time.Second

// errSettling marks a count one over, which settles by itself.
var errSettling = errors.New("a pod is on its way out")

// replicaSetSettled refuses ReplicaSet name if it is being deleted, scaling
// or not the pod's to keep, and its Deployment if it is paused or rolling
// out; it returns the selectors of both.
func replicaSetSettled(ctx context.Context, m *Migration, name string) ([]*metav1.LabelSelector, error) {
	rs, err := m.deps.Client.AppsV1().ReplicaSets(m.config.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get ReplicaSet %s, which controls pod %s: %w", name, m.config.Pod, err)
	}
	if rs.DeletionTimestamp != nil {
		return nil, fmt.Errorf("ReplicaSet %s, which controls pod %s, is being deleted", name, m.config.Pod)
	}
	if want := ptr.Deref[int32](rs.Spec.Replicas, 1); rs.Status.Replicas != want || rs.Status.ObservedGeneration < rs.Generation {
		err := fmt.Errorf("ReplicaSet %s is scaling (%d pods of %d); it could delete pod %s while it moves; wait until it has settled", name, rs.Status.Replicas, want, m.config.Pod)
		if rs.Status.Replicas == want+1 {
			err = fmt.Errorf("%w (%w)", err, errSettling)
		}
		return nil, err
	}
	selectors := []*metav1.LabelSelector{rs.Spec.Selector}
	owner := metav1.GetControllerOf(rs)
	if owner == nil {
		return selectors, nil
	}
	if owner.Kind != "Deployment" {
		return nil, fmt.Errorf("pod %s's ReplicaSet %s is controlled by %s %s, which would replace the pod behind its back; only bare ReplicaSets and Deployments' migrate", m.config.Pod, name, owner.Kind, owner.Name)
	}
	d, err := m.deps.Client.AppsV1().Deployments(m.config.Namespace).Get(ctx, owner.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Deployment %s, which owns pod %s's ReplicaSet: %w", owner.Name, m.config.Pod, err)
	}
	want := ptr.Deref[int32](d.Spec.Replicas, 1)
	switch {
	case d.Spec.Paused:
		return nil, fmt.Errorf("the Deployment %s is paused (a rollout waits): resume it (kubectl rollout resume deployment/%s) and let it finish first", d.Name, d.Name)
	case d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != want || d.Status.Replicas != want:
		err := fmt.Errorf("the Deployment %s is rolling out or scaling (%d of %d pods updated, %d in all); wait for kubectl rollout status deployment/%s", d.Name, d.Status.UpdatedReplicas, want, d.Status.Replicas, d.Name)
		if d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == d.Status.Replicas && d.Status.Replicas == want+1 {
			err = fmt.Errorf("%w (%w)", err, errSettling)
		}
		return nil, err
	}
	return append(selectors, d.Spec.Selector), nil
}

// labelsToHide names the labels that selectors require: without them a pod
// matches none. It fails if a selector requires none (it selects by absence
// only).
func labelsToHide(podLabels map[string]string, selectors []*metav1.LabelSelector) ([]string, error) {
	var hidden []string
	for _, s := range selectors {
		hidden = append(hidden, slices.Collect(maps.Keys(s.MatchLabels))...)
		for _, e := range s.MatchExpressions {
			if e.Operator == metav1.LabelSelectorOpIn || e.Operator == metav1.LabelSelectorOpExists {
				hidden = append(hidden, e.Key)
			}
		}
	}
	slices.Sort(hidden)
	hidden = slices.Compact(hidden)
	rest := maps.Clone(podLabels)
	for _, k := range hidden {
		delete(rest, k)
	}
	for _, s := range selectors {
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			return nil, err
		}
		if sel.Matches(labels.Set(rest)) {
			return nil, fmt.Errorf("its selector %s requires no label, so the restored copy could not be kept from it while it replays", sel)
		}
	}
	return hidden, nil
}

// hideFromReplicaSet takes the labels the ReplicaSet selects by off pod.
func (m *Migration) hideFromReplicaSet(pod *corev1.Pod) {
	for _, k := range m.state.HiddenLabels {
		delete(pod.Labels, k)
	}
}

// handToReplicaSet makes the target, which has taken over, the
// ReplicaSet's pod in place of the source (see the order above); the
// source is deleted by the cleanup that follows, if the ReplicaSet has not
// already.
func (m *Migration) handToReplicaSet(ctx context.Context) error {
	m.progress(report.Cleanup, fmt.Sprintf("waiting for %s to be Ready before ReplicaSet %s sees it", m.config.TargetName, m.state.ReplicaSet))
	if _, err := kube.WaitForPod(ctx, m.deps.Client, m.config.Namespace, m.config.TargetName, podReady); err != nil {
		return fmt.Errorf("hand %s to ReplicaSet %s: %w", m.config.TargetName, m.state.ReplicaSet, err)
	}
	cost := map[string]any{"metadata": map[string]any{"annotations": map[string]string{DeletionCostAnnotation: strconv.Itoa(math.MinInt32)}}}
	if err := m.patchPod(ctx, m.config.Pod, cost); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("mark source %s the first to go: %w", m.config.Pod, err)
	}
	if err := m.revealLabels(ctx); err != nil {
		return fmt.Errorf("hand %s to ReplicaSet %s: %w", m.config.TargetName, m.state.ReplicaSet, err)
	}
	_, err := kube.WaitForPod(ctx, m.deps.Client, m.config.Namespace, m.config.TargetName, func(pod *corev1.Pod) (bool, error) {
		if pod == nil {
			return false, fmt.Errorf("pod %s is gone", m.config.TargetName)
		}
		owner := metav1.GetControllerOf(pod)
		return owner != nil && owner.Kind == "ReplicaSet" && owner.Name == m.state.ReplicaSet, nil
	})
	if err != nil {
		return fmt.Errorf("ReplicaSet %s did not adopt %s: %w", m.state.ReplicaSet, m.config.TargetName, err)
	}
	m.progress(report.Cleanup, fmt.Sprintf("ReplicaSet %s adopted %s", m.state.ReplicaSet, m.config.TargetName))
	return nil
}

func (m *Migration) patchPod(ctx context.Context, name string, patch map[string]any) error {
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = m.deps.Client.CoreV1().Pods(m.config.Namespace).Patch(ctx, name, types.MergePatchType, data, metav1.PatchOptions{})
	return err
}

// podReady: the pod's Ready condition is true.
func podReady(pod *corev1.Pod) (bool, error) {
	if pod == nil {
		return false, fmt.Errorf("the pod is gone")
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}
