package migrate

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// registryPath pushes each checkpoint as an image to the registry of
// --registry, which the target's container runtime pulls and restores.
type registryPath struct{ criRestore }

func (registryPath) check(ctx context.Context, m *Migration) error {
	if m.config.RegistrySecret == "" {
		// The kubelet lets any pod use an image pulled anonymously.
		if !m.config.AllowAnonymousCheckpoints {
			return fmt.Errorf("the checkpoint image (the process's memory) would be pushed to %s and pulled without credentials: any pod on %s could run it, and anyone who reaches the registry read it; pass --registry-secret for a registry that asks for credentials, --transfer direct, or --allow-anonymous-checkpoints to accept that (docs/security.md)", m.config.ImageRepository, m.config.TargetNode)
		}
		m.progress(report.Preflight, "the checkpoint image is pulled without credentials (--allow-anonymous-checkpoints): any pod on "+m.config.TargetNode+
			" may run it while the node keeps it")
	}
	return m.deps.Registry.CheckPush(ctx, m.config.ImageRepository)
}

func (registryPath) receiver(_ *corev1.Node, opts agent.WarmOptions) (agent.WarmOptions, Receiver, error) {
	return opts, Receiver{}, nil
}

func (registryPath) receives() bool { return false }

func (p registryPath) targetReady(ctx context.Context, m *Migration, _ string) error {
	return p.targetRuntimeRestores(ctx, m)
}

func (p registryPath) request(_ context.Context, m *Migration, container, _ string) (agent.PackRequest, error) {
	return agent.PackRequest{Archive: m.state.Archives[container], Container: container, Image: p.image(m.config, m.config.Pod, container, m.tag()), Insecure: m.config.InsecureRegistry}, nil
}

// image is in the registry's repository, under the pod's namespace and pod,
// so that a registry's per-path access rules can keep each namespace's
// checkpoints to its own.
func (registryPath) image(c Config, pod, container, tag string) string {
	return CheckpointImage(c.ImageRepository, c.Namespace, pod, container, tag)
}

func (registryPath) sent(what, _ string, res agent.PackResult) string {
	return fmt.Sprintf("%s → %s (%d KiB, build %d ms, push %d ms)", what, res.Image, res.ArchiveBytes/1024, res.BuildMillis, res.PushMillis)
}

// The image in the registry serves a rollback.
func (registryPath) keepsArchives(Config) bool { return false }

func (registryPath) discard(ctx context.Context, m *Migration) error {
	var left []string
	var errs []error
	for _, ref := range m.state.Images {
		if err := m.deleteImage(ctx, ref); err != nil {
			left, errs = append(left, ref), append(errs, err)
		}
	}
	m.state.Images = nil
	if len(left) > 0 {
		// The restored copy is gone and the source serves: an image the
		// registry would not delete holds nothing anyone needs, only memory
		// that must not linger, so it is named for removal by hand.
		return leftoverError{what: "checkpoint images " + strings.Join(left, ", ") + " (delete them from the registry)", err: errors.Join(errs...)}
	}
	return nil
}

func (registryPath) release(ctx context.Context, m *Migration) error {
	if m.config.KeepImages {
		return nil
	}
	var errs []error
	for _, ref := range m.state.Images {
		if err := m.deps.Registry.Delete(ctx, ref); err != nil {
			errs = append(errs, err)
		}
	}
	m.state.Images = nil
	return errors.Join(errs...)
}

func (registryPath) beforeCreate(context.Context, *Migration, *corev1.Pod, string) error { return nil }
func (registryPath) afterCreate(context.Context, *Migration, *corev1.Pod, string) error  { return nil }
func (registryPath) undoCreate(context.Context, *Migration, string) error                { return nil }

func (p registryPath) describePack(s PlanStep) string {
	return fmt.Sprintf("pack and push %s from the agent on %s (%s), started in preflight", p.image(s.Config, s.Pod, "<container>", s.ID), s.SourceNode, s.AgentImage)
}

func (registryPath) describeRestore(s PlanStep) string {
	return fmt.Sprintf("restore pod %s on %s", s.TargetName, s.TargetNode)
}

func (registryPath) leftAtCleanup(s PlanStep) []string {
	if s.KeepImages {
		return nil
	}
	return []string{"the checkpoint images"}
}

func (registryPath) permissions() []permission { return nil }
