package migrate

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/runtimesupport"
)

// appPollInterval paces polls of an application's state, which has no watch.
const appPollInterval = 100 * time.Millisecond

// restore creates the target pod from the checkpoint images and waits until
// the restored application answers, proving it was restored (same process
// identity as the source) rather than started afresh.
type restore struct{}

// baseImages are the images the migrated containers were first created from.
func (m *Migration) baseImages() []string {
	var bases []string
	baseOf := BaseImages(m.Source)
	for _, c := range m.Source.Spec.Containers {
		if slices.Contains(m.Migrated, c.Name) {
			bases = append(bases, baseOf[c.Name])
		}
	}
	return bases
}

func (restore) Name() report.PhaseName { return report.Restore }

func (restore) Run(ctx context.Context, m *Migration) error {
	m.TargetRequested = true
	m.Record.TargetPod = m.TargetName
	created, err := m.restoreAs(ctx, m.TargetName, m.TargetNode)
	if created != nil {
		m.Target = created
		if saveErr := m.save(ctx); err == nil {
			err = saveErr
		}
	}
	return err
}

// restoreAs creates pod name on node from the checkpoint images and waits
// until the restored application answers as the checkpointed process and
// holds. It returns the pod once created, even if waiting failed.
//
// The node has the base images the restore builds on: preflight had the
// target pull them, and every other restore is onto a node that ran the
// checkpointed container.
func (m *Migration) restoreAs(ctx context.Context, name, node string) (*corev1.Pod, error) {
	pod := TargetPod(m.Source, name, node, m.ID, m.Images, m.RegistrySecret)
	if m.StatefulSet != "" {
		// Per-pod Services select this label: the StatefulSet's own name has
		// it, a shadow copy must not.
		if isMemberName(m.StatefulSet, name) {
			pod.Labels[appsv1.StatefulSetPodNameLabel] = name
		} else {
			delete(pod.Labels, appsv1.StatefulSetPodNameLabel)
		}
	}
	if err := m.save(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	created, err := m.Client.CoreV1().Pods(m.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s on %s: %w", name, node, err)
	}
	m.step(report.PodCreate, "", start, 0)
	m.progress(report.Restore, "pod "+name+" created on "+node)
	start = time.Now()
	// The kubelet may report the containers running only at its next
	// relist, up to a second after the restored application answers: the
	// application is asked as soon as the pod has an address, while the
	// same watch on the pod stops the wait if the restore fails.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	podFailed := make(chan error, 1)
	kubeletAway := m.kubeletAway(watchCtx, node)
	cannotStart := func(err error) error { return fmt.Errorf("pod %s cannot start on %s: %w", name, node, err) }
	addressed := make(chan struct{})
	var once sync.Once
	running := kube.ContainersRunning("restored ", m.Migrated)
	go func() {
		_, err := kube.WaitForPod(watchCtx, m.Client, m.Namespace, name, func(pod *corev1.Pod) (bool, error) {
			done, err := running(pod)
			if done || pod != nil && pod.Status.PodIP != "" {
				once.Do(func() { close(addressed) })
			}
			return done, err
		})
		podFailed <- err
	}()
	select {
	case <-addressed:
	case err := <-podFailed:
		if err != nil {
			return created, m.explainRestoreFailure(ctx, node, err)
		}
		// Running, so addressed too.
	case err := <-kubeletAway:
		return created, cannotStart(err)
	}
	m.progress(report.Restore, "pod has an address; waiting for the restored application")
	app := m.app(name)
	// The restored copy answers as soon as its listener is back, possibly
	// before it has noticed that its broker connection died; it holds only
	// after reconnecting, so wait for that.
	var st ms2m.State
	var answeredAt time.Time
	var podErr error
	err = wait.PollUntilContextCancel(ctx, appPollInterval, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-podFailed:
			if err != nil && ctx.Err() == nil {
				podErr = err
				return false, err
			}
		case err := <-kubeletAway:
			podErr = cannotStart(err)
			return false, podErr
		default:
		}
		var err error
		if st, err = m.App.State(ctx, app); err != nil {
			return false, nil
		}
		if answeredAt.IsZero() {
			answeredAt = time.Now()
		}
		if st.Process != m.SourceState.Process {
			return false, fmt.Errorf("pod %s started a new process instead of restoring the checkpoint; check the target runtime's restore support", name)
		}
		return st.Mode == ms2m.ModeHold, nil
	})
	switch {
	case podErr != nil:
		return created, m.explainRestoreFailure(ctx, node, podErr)
	case err != nil && answeredAt.IsZero():
		return created, fmt.Errorf("the restored application in %s never answered on port %d: %w", name, m.ControlPort, err)
	case err != nil && st.Process != m.SourceState.Process:
		return created, err
	case err != nil:
		return created, fmt.Errorf("the restored application stayed in %s mode instead of holding after its reconnect; it does not follow the MS2M contract: %w", st.Mode, err)
	}
	// Running is when the restored process first answered: the runtime's
	// work ends there, whenever the kubelet reports it.
	m.stepTook(report.PodRunning, "", start, answeredAt.Sub(start), 0)
	m.step(report.AppHolding, "", answeredAt, 0)
	return created, nil
}

// Rollback deletes the restored pod, unless it holds the only full state: a
// StatefulSet pod's copy that replayed after its source was deleted has
// applied messages the source never had and the replay queue no longer
// holds, so it moves back instead.
func (restore) Rollback(ctx context.Context, m *Migration) error {
	if !m.TargetRequested {
		return nil
	}
	if m.SourceDeleted && !m.ReplayStarted.IsZero() && m.Target != nil {
		m.progress(report.Restore, "the restored copy replayed: moving its state back into "+m.Pod+" on "+m.SourceNode)
		if err := m.moveBack(ctx, m.Target, m.State); err != nil {
			return err
		}
		m.SourceDeleted, m.SourceHalted = false, false
	} else if err := m.deletePod(ctx, report.Restore, m.TargetName); err != nil {
		return err
	}
	m.Target, m.TargetRequested = nil, false
	return nil
}

// explainRestoreFailure names the setting when node's runtime refused the
// restore itself (restore is opt-in on some runtimes) and preflight could
// not tell beforehand.
func (m *Migration) explainRestoreFailure(ctx context.Context, node string, err error) error {
	n, getErr := m.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if getErr != nil {
		return err
	}
	if why, ok := runtimesupport.ExplainRestoreFailure(n.Status.NodeInfo.ContainerRuntimeVersion, err.Error()); ok {
		return fmt.Errorf("node %s: %s (%w)", node, why, err)
	}
	return err
}
