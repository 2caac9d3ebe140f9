package migrate

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// stagedPath sends each checkpoint from the source's agent to the
// target's, which stages it on the node (no image anywhere) for the
// kubectl-migrate runtime (RuntimeClass kubectl-migrate): the target pod
// runs under it and its runtime restores each container from what was
// staged for it.
type stagedPath struct{ directPath }

func (stagedPath) receiver(node *corev1.Node, opts agent.WarmOptions) (agent.WarmOptions, Receiver, error) {
	return NewReceiver(node, opts, true)
}

// The container runtime only runs the containers: node-setup checked the
// runtime (ChooseRestore).
func (stagedPath) targetReady(context.Context, *Migration, string) error { return nil }

func (p stagedPath) request(ctx context.Context, m *Migration, container, node string) (agent.PackRequest, error) {
	req, err := p.send(ctx, m, container, node)
	if err == nil {
		req.StageAs = ptr.To(m.staged(container))
		if m.config.Pages == PagesLazy && container != agent.VolumesKey && node == m.config.TargetNode {
			req.Pages = &ociruntime.Identity{Namespace: m.config.Namespace, Pod: m.config.Pod, UID: string(m.state.Source.UID), Container: container}
		}
	}
	return req, err
}

// image names the checkpoint as a direct transfer's would be: what the
// plan shows; the restore finds it staged (State.Images).
func (stagedPath) image(c Config, pod, container, tag string) string {
	return CheckpointImage(agent.DirectRegistry(), c.Namespace, pod, container, tag)
}

func (stagedPath) sent(what, node string, res agent.PackResult) string {
	return fmt.Sprintf("%s staged on %s for the kubectl-migrate runtime (%d KiB, sent in %d ms)", what, node, res.ArchiveBytes/1024, res.PushMillis)
}

// discard deletes the checkpoints staged on the target node: unlike a
// direct transfer's images, they do not go with the target's agent. One
// the runtime restored is gone already. Every one this migration may have
// sent is removed, journaled or not: their paths follow from the target's
// name, and a process that died as an agent staged one (or while it was
// extracting one) never wrote it down, though it is the application's
// memory.
func (p stagedPath) discard(ctx context.Context, m *Migration) error {
	sent := m.stagedKeys()
	staged := make([]string, 0, len(sent))
	for _, c := range sent {
		staged = append(staged, agent.StagedPath(m.staged(c)))
	}
	slices.Sort(staged)
	nodes := []string{m.config.TargetNode}
	if p.keepsArchives(m.config) {
		nodes = append(nodes, m.state.SourceNode) // where a rollback staged them again
	}
	for _, node := range nodes {
		if err := m.deps.Packer.Remove(ctx, m.nextAgentPod(), node, staged); err != nil {
			return fmt.Errorf("remove the checkpoints staged on %s %v: %w", node, staged, err)
		}
	}
	m.state.Images = nil
	return nil
}

// createsEarly: the runtime holds the target container's create until its
// checkpoint is staged (ociruntime.ExpectedPath), so the target is created
// before; not a StatefulSet member's name, which the source holds until
// detach.
func (stagedPath) createsEarly(statefulSet, target string) bool {
	return statefulSet == "" || !isMemberName(statefulSet, target)
}

func (stagedPath) beforeCreate(context.Context, *Migration, *corev1.Pod, string) error { return nil }

// afterCreate gives the target, if its checkpoints were staged before it
// existed, what was staged: from now on its only.
func (p stagedPath) afterCreate(ctx context.Context, m *Migration, created *corev1.Pod, node string) error {
	if created.Name != m.config.TargetName || p.createsEarly(m.config.StatefulSet, m.config.TargetName) {
		return nil
	}
	ids := make([]ociruntime.Identity, 0, len(m.state.Migrated)+1)
	for _, c := range m.stagedKeys() {
		ids = append(ids, ociruntime.Identity{Namespace: m.config.Namespace, Pod: created.Name, UID: string(created.UID), Container: c})
	}
	if err := m.deps.Packer.Bind(ctx, node, ids); err != nil {
		return fmt.Errorf("give the checkpoint staged on %s to pod %s: %w", node, created.Name, err)
	}
	return nil
}

func (stagedPath) undoCreate(context.Context, *Migration, string) error { return nil }

func (stagedPath) beforeRestoreOnSource(ctx context.Context, m *Migration) error {
	return m.stageOnSource(ctx)
}

func (stagedPath) permissions() []permission { return nil }

func (stagedPath) describePack(s PlanStep) string {
	kept := ""
	if s.inPlace() {
		kept = fmt.Sprintf("; the archives stay on %s until the migration ends, for a rollback to restore the source from", s.SourceNode)
	}
	return fmt.Sprintf("stream the checkpoint archives from the agent on %s to the agent on %s (TLS, pinned), which stages them for the kubectl-migrate runtime (no image)%s", s.SourceNode, s.TargetNode, kept)
}

func (stagedPath) describeRestore(s PlanStep) string {
	return fmt.Sprintf("create pod %s on %s from its own images under RuntimeClass %s, whose runtime restores the staged checkpoints", s.TargetName, s.TargetNode, ociruntime.HandlerName)
}
