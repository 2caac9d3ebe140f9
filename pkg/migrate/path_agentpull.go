package migrate

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
)

// agentPullPath sends each checkpoint from the source's agent to the
// target's (--transfer direct), which serves it as an image to its node's
// container runtime, with a pull secret of the restored pod's own
// (pullsecret.go); that runtime restores it.
type agentPullPath struct {
	directPath
	criRestore
}

func (agentPullPath) receiver(node *corev1.Node, opts agent.WarmOptions) (agent.WarmOptions, Receiver, error) {
	return NewReceiver(node, opts, false)
}

// targetReady: the target's runtime restores, and pulls from its agent (a
// probe image the agent serves).
func (p agentPullPath) targetReady(ctx context.Context, m *Migration, puller string) error {
	if err := p.targetRuntimeRestores(ctx, m); err != nil {
		return err
	}
	probe := agent.DirectRegistry() + "/" + agent.ProbeImage
	if err := m.deps.Packer.Prepull(ctx, puller, m.config.TargetNode, []string{probe}); err != nil {
		return fmt.Errorf("node %s's runtime cannot pull from its agent at %s (%w); let it pull from there over plain HTTP (CRI-O: insecure_registries in [crio.image]; containerd: a hosts.toml for %[2]s in its config_path), or use a registry", m.config.TargetNode, agent.DirectRegistry(), err)
	}
	return nil
}

func (p agentPullPath) request(ctx context.Context, m *Migration, container, node string) (agent.PackRequest, error) {
	return p.send(ctx, m, container, node)
}

// image is the tag the target node pulls from its agent.
func (agentPullPath) image(c Config, pod, container, tag string) string {
	return CheckpointImage(agent.DirectRegistry(), c.Namespace, pod, container, tag)
}

func (agentPullPath) sent(what, _ string, res agent.PackResult) string {
	return fmt.Sprintf("%s → %s (%d KiB, sent in %d ms)", what, res.Image, res.ArchiveBytes/1024, res.PushMillis)
}

// The images go with the target's agent.
func (agentPullPath) discard(_ context.Context, m *Migration) error {
	m.state.Images = nil
	return nil
}

func (agentPullPath) beforeCreate(ctx context.Context, m *Migration, pod *corev1.Pod, node string) error {
	return m.writePullSecret(ctx, pod, node)
}

func (agentPullPath) afterCreate(ctx context.Context, m *Migration, created *corev1.Pod, _ string) error {
	return m.givePullSecret(ctx, created)
}

func (agentPullPath) undoCreate(ctx context.Context, m *Migration, node string) error {
	return m.removePullSecret(ctx, node)
}

func (p agentPullPath) describePack(s PlanStep) string {
	return fmt.Sprintf("stream the checkpoint archives from the agent on %s to the agent on %s (no registry), which serves them to its node as %s", s.SourceNode, s.TargetNode, p.image(s.Config, s.Pod, "<container>", s.ID))
}

func (agentPullPath) describeRestore(s PlanStep) string {
	return fmt.Sprintf("restore pod %s on %s, which pulls its checkpoint images from its node's agent with a pull secret of its own (deleted with the pod)", s.TargetName, s.TargetNode)
}

func (agentPullPath) permissions() []permission { return pullSecretPermissions }
