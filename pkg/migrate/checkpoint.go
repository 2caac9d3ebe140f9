package migrate

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// checkpoint checkpoints each container through the source node's agent,
// which asks the node's runtime as the kubelet's checkpoint API would. The
// source keeps running (it pauses for well under a second).
type checkpoint struct{}

func (checkpoint) Name() report.PhaseName { return report.Checkpoint }

func (checkpoint) Run(ctx context.Context, m *Migration) error {
	if m.state.Archives == nil {
		m.state.Archives = map[string]string{}
	}
	// Setup started it; a recovery's move back starts with none.
	if err := m.agentOn(ctx, m.state.SourceNode); err != nil {
		return err
	}
	volumes := m.carriedVolumes()
	lazy := m.config.Pages == PagesLazy
	// A lazy checkpoint leaves the source frozen while its volumes are
	// copied: no pause needed.
	if len(volumes) > 0 && m.config.Strategy == MS2M && !m.state.SourceHalted && !lazy {
		if err := m.pauseSource(ctx); err != nil {
			return err
		}
	}
	for _, c := range m.state.Migrated {
		// Until the agent answers, only the pattern of the archive is
		// known: enough for a rollback to remove it.
		m.state.Archives[c] = agent.ArchivePattern(m.config.Namespace, m.config.Pod, c)
		if err := m.save(ctx); err != nil {
			return err
		}
		start := time.Now()
		res, err := m.deps.Packer.Checkpoint(ctx, m.state.SourceNode, agent.CheckpointRequest{
			Namespace: m.config.Namespace, Pod: m.config.Pod, UID: string(m.state.Source.UID), Container: c,
			TimeoutSeconds: int64(m.config.CheckpointTimeout.Round(time.Second) / time.Second),
			LazyPages:      lazy,
		})
		if err != nil {
			return err
		}
		m.step(report.CheckpointCall, c, start, 0)
		m.state.Archives[c] = res.Archive
		m.state.SourceFrozen = m.state.SourceFrozen || res.LazyPages
		if lazy && !res.LazyPages {
			// A whole checkpoint: another runtime runs the container.
			return fmt.Errorf("container %s of pod %s was checkpointed with its whole memory: the kubectl-migrate runtime does not run it on %s; move it with --pages eager", c, m.config.Pod, m.state.SourceNode)
		}
		path := res.Archive
		if err := m.save(ctx); err != nil {
			return err
		}
		m.progress(report.Checkpoint, fmt.Sprintf("container %s → %s", c, path))
	}
	if len(volumes) > 0 {
		if err := m.snapshotVolumes(ctx, volumes); err != nil {
			return err
		}
	}
	if m.config.Strategy == MS2M && !m.state.SourceFrozen {
		if err := m.markCheckpointed(ctx); err != nil {
			return err
		}
	}
	return m.unpauseSource(ctx)
}

// markCheckpointed tells the live source its checkpoint is taken: the mark
// is in the checkpoint now, and the source drops it. A source a lazy
// checkpoint froze is told once its pages have left (replay).
func (m *Migration) markCheckpointed(ctx context.Context) error {
	_, err := m.deps.App.Control(ctx, m.sourceApp(), protocol.Control{Type: protocol.Checkpointed, Payload: protocol.ControlPayload{Migration: m.tag()}})
	return err
}

func (checkpoint) Rollback(ctx context.Context, m *Migration) error {
	if err := m.awaitSourceResumed(ctx); err != nil {
		return err
	}
	if err := m.removeArchives(ctx); err != nil {
		return err
	}
	return m.unpauseSource(ctx)
}

// deleteImage deletes a checkpoint image from the registry, retrying a
// registry that is briefly away.
func (m *Migration) deleteImage(ctx context.Context, ref string) error {
	var err error
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Steps: 5}
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		err = m.deps.Registry.Delete(ctx, ref)
		return err == nil, nil
	})
	return err
}

// removeArchives deletes the archives still on the source node: they hold
// the process's memory.
func (m *Migration) removeArchives(ctx context.Context) error {
	if len(m.state.Archives) == 0 {
		return nil
	}
	paths := slices.Sorted(maps.Values(m.state.Archives))
	if err := m.deps.Packer.Remove(ctx, m.nextAgentPod(), m.state.SourceNode, paths); err != nil {
		return fmt.Errorf("remove checkpoint archives %v from %s: %w", paths, m.state.SourceNode, err)
	}
	m.state.Archives = nil
	return nil
}

// stagedKeys names what a migration through the kubectl-migrate runtime
// stages: the emptyDir data, if carried, and each migrated container.
func (m *Migration) stagedKeys() []string {
	if len(m.carriedVolumes()) > 0 {
		return append([]string{agent.VolumesKey}, m.state.Migrated...)
	}
	return slices.Clone(m.state.Migrated)
}

// stageOnSource sends the kept archives (checkpointPath.keepsArchives) from the source
// node's agent to itself, staged for the kubectl-migrate runtime to restore
// the source there: a StatefulSet pod's rollback after its source was
// deleted. The target's restore used the first copies.
func (m *Migration) stageOnSource(ctx context.Context) error {
	for _, c := range m.packed() {
		if _, kept := m.state.Archives[c]; !kept {
			return fmt.Errorf("the archive of %s is no longer on %s", archiveName(c), m.state.SourceNode)
		}
		req, err := m.path().request(ctx, m, c, m.state.SourceNode)
		if err != nil {
			return err
		}
		res, err := m.deps.Packer.Pack(ctx, m.nextAgentPod(), m.state.SourceNode, req)
		if err != nil {
			return fmt.Errorf("stage %s on %s: %w", archiveName(c), m.state.SourceNode, err)
		}
		m.progress(report.Detach, fmt.Sprintf("%s staged on %s for the kubectl-migrate runtime", archiveName(c), m.state.SourceNode))
		m.state.Images[c] = res.Staged
	}
	return nil
}

// packed names the archives a migration sends: the emptyDir data first,
// as the kubectl-migrate runtime restores a container as soon as its
// checkpoint is staged, filling the volumes it mounts then; then each
// migrated container's checkpoint.
func (m *Migration) packed() []string {
	if _, ok := m.state.Archives[agent.VolumesKey]; ok {
		return append([]string{agent.VolumesKey}, m.state.Migrated...)
	}
	return slices.Clone(m.state.Migrated)
}

// archiveName says what the archive of key (packed) holds.
func archiveName(key string) string {
	if key == agent.VolumesKey {
		return "the emptyDir volumes"
	}
	return "container " + key
}

// packImages packs each archive as a checkpoint image and pushes it, from a
// short-lived agent pod on the source node; the agent deletes each archive
// once pushed.
type packImages struct{}

func (packImages) Name() report.PhaseName { return report.Image }

func (packImages) Run(ctx context.Context, m *Migration) error {
	if m.state.Images == nil {
		m.state.Images = map[string]string{}
	}
	for _, c := range m.packed() {
		req, err := m.path().request(ctx, m, c, m.config.TargetNode)
		if err != nil {
			return err
		}
		start := time.Now()
		res, err := m.deps.Packer.Pack(ctx, m.nextAgentPod(), m.state.SourceNode, req)
		if err != nil {
			return err
		}
		// The agent's own timings; the rest of the call is reaching it.
		built := start.Add(time.Duration(res.BuildMillis) * time.Millisecond)
		m.stepTook(report.Pack, c, start, time.Duration(res.BuildMillis)*time.Millisecond, res.ArchiveBytes)
		m.stepTook(report.Push, c, built, time.Duration(res.PushMillis)*time.Millisecond, res.ArchiveBytes)
		if !req.KeepArchive {
			delete(m.state.Archives, c)
		}
		m.state.Images[c] = cmp.Or(res.Image, res.Staged)
		if err := m.save(ctx); err != nil {
			return err
		}
		if res.Staged == "" {
			m.Record.Images = append(m.Record.Images, res.Image)
		}
		m.Record.ArchiveBytes += res.ArchiveBytes
		m.progress(report.Image, m.path().sent(archiveName(c), m.config.TargetNode, res))
	}
	return nil
}

func (packImages) Rollback(ctx context.Context, m *Migration) error {
	// The archives first: they are on the node, which is up.
	if err := m.removeArchives(ctx); err != nil {
		return err
	}
	return m.path().discard(ctx, m)
}
