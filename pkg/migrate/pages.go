package migrate

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// pagesPoll paces the asks for the last page, and the looks at the copy.
const pagesPoll = 200 * time.Millisecond

// awaitLastPage waits, with lazy pages, until every migrated container's
// pages have all arrived on the target, the copy running all along: the
// commit point. Until then the source is frozen (never killed) and a
// failure rolls back to it: the target goes, and the source resumes as its
// page session ends. A copy that stops fails the wait at once: the source
// is frozen meanwhile.
func (m *Migration) awaitLastPage(ctx context.Context) error {
	start := time.Now()
	node := m.config.TargetNode
	var statuses []agent.PagesStatus
	err := wait.PollUntilContextTimeout(ctx, pagesPoll, m.config.PhaseTimeout, true, func(ctx context.Context) (bool, error) {
		pod, err := m.deps.Client.CoreV1().Pods(m.config.Namespace).Get(ctx, m.config.TargetName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if c, stopped := stoppedContainer(pod, m.state.Migrated); stopped {
			return false, fmt.Errorf("container %s of pod %s stopped while its pages arrived", c, m.config.TargetName)
		}
		var ended bool
		statuses, ended, err = m.pagesEnded(ctx, node, m.expectedIDs())
		return ended, err
	})
	if err != nil {
		return fmt.Errorf("wait for the last pages of pod %s on %s: %w", m.config.TargetName, node, err)
	}
	for _, s := range statuses {
		if !s.Done {
			return fmt.Errorf("the pages of container %s did not all arrive on %s: %s", s.Container, node, s.Error)
		}
	}
	m.step(report.LastPage, "", start, 0)
	phase := report.Restore
	if m.phase < len(m.Record.Phases) {
		phase = m.Record.Phases[m.phase].Name // MS2M's replay
	}
	m.progress(phase, "the last page arrived on "+node)
	return nil
}

// thawAfterLastPage, after a lazy checkpoint of MS2M's live source, waits
// while the copy replays until its last page arrived and the source, frozen
// meanwhile, runs again, and then tells the source its checkpoint is taken:
// it consumes its primary queue again until the switchover. Before the last
// page a failure rolls back to the source: the replay queue had every
// message the copy took.
func (m *Migration) thawAfterLastPage(ctx context.Context) error {
	if !m.state.SourceFrozen {
		return nil
	}
	frozen := time.Now()
	if err := m.awaitLastPage(ctx); err != nil {
		return err
	}
	if err := m.awaitSourceResumed(ctx); err != nil {
		return err
	}
	if err := m.markCheckpointed(ctx); err != nil {
		return fmt.Errorf("tell the source, thawed, that its checkpoint is taken: %w", err)
	}
	m.progress(report.Replay, fmt.Sprintf("source runs again, %s after the copy began replaying", time.Since(frozen).Round(time.Millisecond)))
	return nil
}

// stoppedContainer names a migrated container of pod that ended, or ran
// again (the kubelet may not report it running yet: that is no stop).
func stoppedContainer(pod *corev1.Pod, migrated []string) (string, bool) {
	for _, cs := range pod.Status.ContainerStatuses {
		if slices.Contains(migrated, cs.Name) && (cs.State.Terminated != nil || cs.RestartCount > 0 || cs.LastTerminationState.Terminated != nil) {
			return cs.Name, true
		}
	}
	return "", false
}

// sourcePagesTimeout bounds the wait for the source's page session to
// end: its bridges end a session in which nothing moved for 10 s.
const sourcePagesTimeout = 30 * time.Second

// awaitSourceResumed waits, once a lazy checkpoint froze the source,
// until its page session ended and the source runs again (frozen, it
// answers nothing): nothing asks anything of the source before.
func (m *Migration) awaitSourceResumed(ctx context.Context) error {
	if !m.state.SourceFrozen {
		return nil
	}
	ids := make([]ociruntime.Identity, 0, len(m.state.Migrated))
	for _, c := range m.state.Migrated {
		ids = append(ids, ociruntime.Identity{Namespace: m.config.Namespace, Pod: m.config.Pod, UID: string(m.state.Source.UID), Container: c})
	}
	if err := m.agentOn(ctx, m.state.SourceNode); err != nil {
		return err
	}
	err := wait.PollUntilContextTimeout(ctx, pagesPoll, sourcePagesTimeout, true, func(ctx context.Context) (bool, error) {
		_, ended, err := m.pagesEnded(ctx, m.state.SourceNode, ids)
		return ended, err
	})
	if err != nil {
		return fmt.Errorf("the source's page session on %s did not end: %w", m.state.SourceNode, err)
	}
	m.state.SourceFrozen = false
	return m.save(ctx)
}

// pagesEnded asks node's agent how the page sessions of ids went, and
// whether all of them ended.
func (m *Migration) pagesEnded(ctx context.Context, node string, ids []ociruntime.Identity) ([]agent.PagesStatus, bool, error) {
	statuses, err := m.deps.Packer.PagesResults(ctx, node, ids)
	if err != nil {
		return nil, false, err
	}
	for _, s := range statuses {
		if !s.Ended {
			return statuses, false, nil
		}
	}
	return statuses, true, nil
}

// checkProbesOutlastFreeze refuses lazy pages for a source whose
// liveness probe would restart it while it is frozen: its pages stay in it
// until the last one arrived, and a restart loses them with its memory and
// the way back. The freeze is predicted as an eager move's (FreezeModel),
// which takes longer than the page transfer: a bound.
func checkProbesOutlastFreeze(ctx context.Context, m *Migration) error {
	src := m.state.Source
	var probed *corev1.Container
	var tolerated time.Duration
	for i := range src.Spec.Containers {
		c := &src.Spec.Containers[i]
		if c.LivenessProbe == nil {
			continue
		}
		if d := frozenTolerated(c.LivenessProbe); probed == nil || d < tolerated {
			probed, tolerated = c, d
		}
	}
	if probed == nil {
		return nil
	}
	freeze := NewFreezeModel(m.deps.Client, m.config.Namespace).Predict(ctx, src)
	if freeze.Millis <= 0 {
		return fmt.Errorf("pod %s stays frozen until its last page arrived, and container %s's liveness probe restarts it after %s frozen; how long that takes is unknown (neither metrics.k8s.io nor a memory limit tells its memory): give the pod memory limits, or move it with --pages eager",
			src.Name, probed.Name, tolerated)
	}
	if frozen := time.Duration(freeze.Millis) * time.Millisecond; frozen > tolerated {
		p := probeDefaults(probed.LivenessProbe)
		need := int32(math.Ceil((frozen-time.Duration(p.TimeoutSeconds)*time.Second).Seconds()/float64(p.PeriodSeconds))) + 1
		return fmt.Errorf("pod %s stays frozen until its last page arrived (%s), and container %s's liveness probe would restart it after %s frozen (failureThreshold %d, periodSeconds %d, timeoutSeconds %d): raise its failureThreshold to %d, or move it with --pages eager",
			src.Name, freeze.Summary(), probed.Name, tolerated, p.FailureThreshold, p.PeriodSeconds, p.TimeoutSeconds, need)
	}
	return nil
}

// frozenTolerated is how long a frozen container outlives probe in the
// worst case: the first probe to fail starts as the freeze does, and the
// kubelet restarts the container when the failureThreshold-th one timed
// out, (failureThreshold-1)·period + timeout later.
func frozenTolerated(probe *corev1.Probe) time.Duration {
	p := probeDefaults(probe)
	return time.Duration((p.FailureThreshold-1)*p.PeriodSeconds+p.TimeoutSeconds) * time.Second
}

// probeDefaults is probe with the API server's defaults where it left a
// field zero (a pod built without them, as in a fake clientset).
func probeDefaults(probe *corev1.Probe) corev1.Probe {
	p := *probe
	if p.PeriodSeconds <= 0 {
		p.PeriodSeconds = 10
	}
	if p.TimeoutSeconds <= 0 {
		p.TimeoutSeconds = 1
	}
	if p.FailureThreshold <= 0 {
		p.FailureThreshold = 3
	}
	return p
}
