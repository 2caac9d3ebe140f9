package migrate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// emptyDir volumes move with the pod: their files at the moment of the
// checkpoint are copied on the source node (by its agent, into an archive
// beside the checkpoints), sent as an image like a checkpoint (through the
// registry, or straight to the target node), and copied into the target
// pod's emptyDir volumes by an init container that runs that image, before
// the runtime restores the containers, whose open files there must exist.
// A live source (MS2M) does not consume meanwhile: files and memory are of
// one moment, so no message's effect on the files is lost or applied twice.

// DefaultMaxVolumeBytes bounds the emptyDir data of a migration when
// Config.MaxVolumeBytes is 0.
const DefaultMaxVolumeBytes = 1 << 30

// volumeInitContainer is the target pod's init container that fills its
// emptyDir volumes.
const volumeInitContainer = "ms2m-volumes"

// CarriedVolumes are the emptyDir volumes of pod that its containers named
// in containers mount: a migration of those carries their data.
func CarriedVolumes(pod *corev1.Pod, containers []string) []string {
	empty := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil {
			empty[v.Name] = true
		}
	}
	var names []string
	for _, c := range pod.Spec.Containers {
		if !slices.Contains(containers, c.Name) {
			continue
		}
		for _, vm := range c.VolumeMounts {
			if empty[vm.Name] && !slices.Contains(names, vm.Name) {
				names = append(names, vm.Name)
			}
		}
	}
	slices.Sort(names)
	return names
}

func (m *Migration) carriedVolumes() []string {
	if m.state.Source == nil {
		return nil
	}
	return CarriedVolumes(m.state.Source, m.state.Migrated)
}

func (c Config) maxVolumeBytes() int64 { return cmp.Or(c.MaxVolumeBytes, DefaultMaxVolumeBytes) }

// checkVolumeSize measures the volumes on the source node (preflight), so
// that data over the bound is refused before anything changes.
func (m *Migration) checkVolumeSize(ctx context.Context) error {
	volumes := m.carriedVolumes()
	if len(volumes) == 0 {
		return nil
	}
	res, err := m.deps.Packer.SnapshotVolumes(ctx, m.state.SourceNode, agent.SnapshotRequest{PodUID: string(m.state.Source.UID), Volumes: volumes, MaxBytes: m.config.maxVolumeBytes()})
	if err != nil {
		return m.volumeError(err, volumes)
	}
	m.progress(report.Setup, fmt.Sprintf("emptyDir %s: %d file(s), %s, move with the pod", strings.Join(volumes, ", "), res.Files, bytesText(res.Bytes)))
	return nil
}

func (m *Migration) volumeError(err error, volumes []string) error {
	if strings.Contains(err.Error(), agent.ErrTooLarge.Error()) {
		return fmt.Errorf("the emptyDir volumes %s hold more than --max-volume-data (%s) on %s: raise it, or keep that data out of the migrated containers' emptyDir volumes", strings.Join(volumes, ", "), bytesText(m.config.maxVolumeBytes()), m.state.SourceNode)
	}
	return fmt.Errorf("snapshot the emptyDir volumes on %s: %w", m.state.SourceNode, err)
}

func bytesText(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}

// snapshotVolumes copies the carried volumes' files into an archive on the
// source node, named like a checkpoint's so every path that removes
// archives (rollback, recovery, the agent's checks) covers it.
func (m *Migration) snapshotVolumes(ctx context.Context, volumes []string) error {
	archive := strings.Replace(agent.ArchivePattern(m.config.Namespace, m.config.Pod, agent.VolumesKey), "*", m.tag(), 1)
	m.state.Archives[agent.VolumesKey] = archive
	if err := m.save(ctx); err != nil {
		return err
	}
	if err := m.agentOn(ctx, m.state.SourceNode); err != nil {
		return err
	}
	start := time.Now()
	res, err := m.deps.Packer.SnapshotVolumes(ctx, m.state.SourceNode, agent.SnapshotRequest{PodUID: string(m.state.Source.UID), Volumes: volumes, Archive: archive, MaxBytes: m.config.maxVolumeBytes()})
	if err != nil {
		return m.volumeError(err, volumes)
	}
	m.step(report.VolumeSnapshot, "", start, res.Bytes)
	msg := fmt.Sprintf("emptyDir %s → %s (%d file(s), %s)", strings.Join(volumes, ", "), archive, res.Files, bytesText(res.Bytes))
	if len(res.Skipped) > 0 {
		msg += "; not carried (the process makes them again): " + strings.Join(res.Skipped, ", ")
	}
	m.progress(report.Checkpoint, msg)
	return nil
}

// pauseSource stops a live source from consuming while its checkpoint and
// volumes are taken; the journal says so first, so a rollback after a
// crash resumes it.
func (m *Migration) pauseSource(ctx context.Context) error {
	if err := m.journaled(ctx, &m.state.SourcePaused, true); err != nil {
		return err
	}
	if _, err := m.deps.App.Control(ctx, m.sourceApp(), protocol.Control{Type: protocol.Stop, Payload: protocol.ControlPayload{Target: m.targetIdentity()}}); err != nil {
		return fmt.Errorf("pause the source for its emptyDir snapshot: %w", err)
	}
	return nil
}

// unpauseSource lets a paused source consume again.
func (m *Migration) unpauseSource(ctx context.Context) error {
	if !m.state.SourcePaused {
		return nil
	}
	if _, err := m.deps.App.Control(ctx, m.sourceApp(), protocol.Control{Type: protocol.Resume}); err != nil {
		return fmt.Errorf("resume the source after its emptyDir snapshot: %w", err)
	}
	m.state.SourcePaused = false
	return m.save(ctx)
}

// volumeInit is the init container that fills the carried emptyDir
// volumes of source's migrated containers from volumeImage, running as the
// first of them runs, so the files it writes are the application's.
func volumeInit(source *corev1.Pod, volumeImage string, migrated []string) corev1.Container {
	init := corev1.Container{
		Name: volumeInitContainer, Image: volumeImage, ImagePullPolicy: corev1.PullIfNotPresent,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	for _, c := range source.Spec.Containers {
		if slices.Contains(migrated, c.Name) && c.SecurityContext != nil {
			init.SecurityContext = c.SecurityContext.DeepCopy()
			break
		}
	}
	for _, name := range CarriedVolumes(source, migrated) {
		init.VolumeMounts = append(init.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: image.VolumeMounts + "/" + name})
	}
	return init
}
