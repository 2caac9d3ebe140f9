package migrate

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// pagesPoll paces the asks for the last page.
const pagesPoll = 50 * time.Millisecond

// awaitLastPage waits, with lazy pages, until every migrated container's
// pages have all arrived on the target, and the copy still runs: the
// commit point. Until then the source is frozen (never killed) and a
// failure rolls back to it: the target goes, and the source resumes as its
// page session ends.
func (m *Migration) awaitLastPage(ctx context.Context) error {
	start := time.Now()
	node := m.config.TargetNode
	var statuses []agent.PagesStatus
	err := wait.PollUntilContextTimeout(ctx, pagesPoll, m.config.PhaseTimeout, true, func(ctx context.Context) (bool, error) {
		var err error
		if statuses, err = m.deps.Packer.PagesResults(ctx, node, m.expectedIDs()); err != nil {
			return false, err
		}
		for _, s := range statuses {
			if !s.Ended {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the last pages of pod %s on %s: %w", m.config.TargetName, node, err)
	}
	for _, s := range statuses {
		if !s.Done {
			return fmt.Errorf("the pages of container %s did not all arrive on %s: %s", s.Container, node, s.Error)
		}
	}
	// A copy that died meanwhile was restarted afresh by the kubelet.
	pod, err := m.deps.Client.CoreV1().Pods(m.config.Namespace).Get(ctx, m.config.TargetName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if c, stopped := stoppedContainer(pod, m.state.Migrated); stopped {
		return fmt.Errorf("container %s of pod %s stopped while its pages arrived", c, m.config.TargetName)
	}
	m.step(report.LastPage, "", start, 0)
	m.progress(report.Restore, "the last page arrived on "+node)
	return nil
}

// stoppedContainer names a migrated container of pod that does not run, or
// ran again.
func stoppedContainer(pod *corev1.Pod, migrated []string) (string, bool) {
	running := map[string]bool{}
	for _, cs := range pod.Status.ContainerStatuses {
		running[cs.Name] = cs.State.Running != nil && cs.RestartCount == 0
	}
	for _, c := range migrated {
		if !running[c] {
			return c, true
		}
	}
	return "", false
}
