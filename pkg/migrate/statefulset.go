package migrate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// A StatefulSet pod keeps its name, ordinal and labels, so the source and
// its restored copy cannot coexist (sequential mode, the paper's). Deleting
// the pod would make the StatefulSet controller recreate it on the old node
// at once, so the StatefulSet itself is deleted with its pods orphaned, the
// source pod is deleted, the copy is restored under the same name on the
// target node, and the StatefulSet is created again from its saved spec: the
// controller adopts the restored pod (same controller-revision-hash) and the
// untouched ordinals, and its spec is exactly as before.

// isMemberName reports whether name is a pod name of StatefulSet sts
// (sts-ORDINAL), the way its controller tells its members apart.
func isMemberName(sts, name string) bool {
	ordinal, ok := strings.CutPrefix(name, sts+"-")
	_, err := strconv.ParseUint(ordinal, 10, 32)
	return ok && err == nil
}

// detach frees the StatefulSet pod's name: it orphans the StatefulSet's pods
// by deleting the StatefulSet and deletes the pod holding the name. In
// sequential mode that pod is the source, which stops first; in shadow mode
// it is the source already replaced by the shadow.
type detach struct{}

func (detach) Name() report.PhaseName { return report.Detach }

func (detach) Run(ctx context.Context, m *Migration) error {
	inPlace := m.config.Pod == m.config.TargetName
	if inPlace && m.config.Strategy.Contract() { // stop-and-copy stopped it at the start already; checkpoint/restore cut it off
		if err := m.haltSource(ctx); err != nil {
			return err
		}
	}
	sts, err := m.deps.Client.AppsV1().StatefulSets(m.config.Namespace).Get(ctx, m.config.StatefulSet, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && m.state.SavedSTS != nil:
		m.state.STSDeleted = true // an earlier stage orphaned its pods already
	case err != nil:
		return fmt.Errorf("get statefulset %s: %w", m.config.StatefulSet, err)
	default:
		m.state.SavedSTS = sts.DeepCopy()
		// The journal must hold the spec before the StatefulSet goes.
		if err := m.journaled(ctx, &m.state.STSDeleted, true); err != nil {
			return err
		}
		if err := deleteOrphaning(ctx, m, sts); err != nil {
			return err
		}
	}
	m.progress(report.Detach, "statefulset "+m.config.StatefulSet+" deleted with its pods orphaned; deleting "+m.config.TargetName)
	if err := m.journaled(ctx, &m.state.SourceDeleted, inPlace); err != nil {
		return err
	}
	return kube.DeleteAndWait(ctx, m.deps.Client, m.config.Namespace, m.config.TargetName, nil)
}

// Rollback brings the source back as it was: if its pod was deleted, the
// checkpoint is restored on the source node under the same name and replays
// up to where the source stopped; then the StatefulSet is created again. In
// shadow mode the shadow still serves, and the shadow's handover rollback
// brings the StatefulSet and its pod back.
func (detach) Rollback(ctx context.Context, m *Migration) error {
	if m.config.Pod != m.config.TargetName {
		return nil
	}
	var errs []error
	if m.state.SourceDeleted {
		if err := m.restoreSourceInPlace(ctx); err != nil {
			errs = append(errs, fmt.Errorf("restore the source on %s: %w", m.state.SourceNode, err))
		}
	} else if err := resumeSource(ctx, m); err != nil {
		errs = append(errs, err)
	}
	orphaned := m.state.STSDeleted
	if err := recreateStatefulSet(ctx, m); err != nil {
		errs = append(errs, err)
	} else if orphaned && len(errs) == 0 {
		// Rolled back means whole again: the StatefulSet owns its pod.
		if err := awaitAdoption(ctx, m, m.config.Pod); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Migration) restoreSourceInPlace(ctx context.Context) error {
	pod, err := m.deps.Client.CoreV1().Pods(m.config.Namespace).Get(ctx, m.config.Pod, metav1.GetOptions{})
	if err == nil && pod.UID == m.state.Source.UID && pod.DeletionTimestamp == nil {
		// The journal said "deleting" but the process died before the delete.
		m.state.SourceDeleted = false
		return resumeSource(ctx, m)
	}
	if err := kube.DeleteAndWait(ctx, m.deps.Client, m.config.Namespace, m.config.Pod, nil); err != nil { // a source still terminating
		return err
	}
	if err := m.path().beforeRestoreOnSource(ctx, m); err != nil {
		return err
	}
	if _, _, err := m.restoreAs(ctx, m.config.Pod, m.state.SourceNode); err != nil {
		return err
	}
	if !m.config.Strategy.Contract() {
		// It runs from its checkpoint, in a pod of its own that no cut
		// holds: what it acknowledged before the cut is in it. It was
		// created as a copy is, without the labels its clients and its
		// StatefulSet select it by.
		if err := m.giveHiddenLabels(ctx, m.config.Pod); err != nil {
			return err
		}
		m.state.SourceDeleted, m.state.SourceIsolated = false, false
		return nil
	}
	if err := m.resumeRestored(ctx, m.sourceApp(), m.state.ReplayQueue, m.state.SourceFinal.Position()); err != nil {
		return err
	}
	m.state.SourceDeleted, m.state.SourceHalted = false, false
	return nil
}

// resumeRestored puts a restored instance that holds back on its primary
// queue: with a replay queue, after replaying up to until.
func (m *Migration) resumeRestored(ctx context.Context, t appctl.Target, replayQueue string, until protocol.Position) error {
	resume := protocol.Control{Type: protocol.Resume}
	if replayQueue != "" {
		if _, err := m.deps.App.Control(ctx, t, protocol.Control{Type: protocol.StartReplay, Payload: protocol.ControlPayload{Queue: replayQueue}}); err != nil {
			return err
		}
		resume = protocol.EndReplayAt(until)
	}
	if _, err := m.deps.App.Control(ctx, t, resume); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return m.waitPrimary(ctx, t)
}

func deleteOrphaning(ctx context.Context, m *Migration, sts *appsv1.StatefulSet) error {
	err := m.deps.Client.AppsV1().StatefulSets(m.config.Namespace).Delete(ctx, sts.Name, metav1.DeleteOptions{
		PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan),
		Preconditions:     &metav1.Preconditions{UID: &sts.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete statefulset %s (orphaning its pods): %w", sts.Name, err)
	}
	m.state.STSDeleted = true
	// The orphan finalizer runs first; wait until the object is really gone.
	return wait.PollUntilContextCancel(ctx, appPollInterval, true, func(ctx context.Context) (bool, error) {
		_, err := m.deps.Client.AppsV1().StatefulSets(m.config.Namespace).Get(ctx, sts.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// recreateStatefulSet creates the StatefulSet again from its saved spec.
func recreateStatefulSet(ctx context.Context, m *Migration) error {
	if !m.state.STSDeleted || m.state.SavedSTS == nil {
		return nil
	}
	saved := m.state.SavedSTS
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: saved.Name, Namespace: saved.Namespace, Labels: saved.Labels, Annotations: saved.Annotations},
		Spec:       *saved.Spec.DeepCopy(),
	}
	// Already there: the delete never happened, or an earlier try of this
	// step (a recovery run again) created it.
	if _, err := m.deps.Client.AppsV1().StatefulSets(m.config.Namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create statefulset %s again: %w", saved.Name, err)
	}
	m.state.STSDeleted = false
	return nil
}

// adopt creates the StatefulSet again and waits until it owns the restored
// pod.
type adopt struct{}

func (adopt) Name() report.PhaseName { return report.Adopt }

func (adopt) Run(ctx context.Context, m *Migration) error {
	if err := recreateStatefulSet(ctx, m); err != nil {
		return err
	}
	return awaitAdoption(ctx, m, m.config.TargetName)
}

// awaitAdoption waits until the StatefulSet, created again, owns pod name:
// it adopts its orphaned pods by their labels, and until then the set is
// not whole (and a user sees an orphan).
func awaitAdoption(ctx context.Context, m *Migration, name string) error {
	ctx, cancel := context.WithTimeout(ctx, m.config.PhaseTimeout)
	defer cancel()
	_, err := kube.WaitForPod(ctx, m.deps.Client, m.config.Namespace, name, func(pod *corev1.Pod) (bool, error) {
		if pod == nil {
			return false, errors.New("the restored pod disappeared")
		}
		owner := metav1.GetControllerOf(pod)
		return owner != nil && owner.Kind == "StatefulSet" && owner.Name == m.config.StatefulSet, nil
	})
	if err != nil {
		return fmt.Errorf("statefulset %s did not adopt pod %s: %w", m.config.StatefulSet, name, err)
	}
	return nil
}

// Rollback orphans the pods again, so the later rollbacks (deleting the
// restored pod, restoring the source) do not race the controller.
func (adopt) Rollback(ctx context.Context, m *Migration) error {
	sts, err := m.deps.Client.AppsV1().StatefulSets(m.config.Namespace).Get(ctx, m.config.StatefulSet, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return deleteOrphaning(ctx, m, sts)
}
