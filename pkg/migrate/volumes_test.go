package migrate_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// withScratch gives the world's consumer an emptyDir its container mounts.
func withScratch(t *testing.T, w *migratetest.World, medium corev1.StorageMedium) {
	t.Helper()
	ctx := context.Background()
	pod, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.UID = "0b7c3d52-6b1a-4b9e-9a55-3f0d1c2e4a77"
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: medium}}})
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: "/scratch"})
	if _, err := w.Client.CoreV1().Pods("default").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestEmptyDirMovesWithThePod: the emptyDir's files are snapshotted on the
// source node while a live source consumes nothing (so they and the
// checkpointed memory are of one moment), sent like a checkpoint, and copied
// into the target's emptyDir by an init container before its containers
// are restored; nothing of them is left behind.
func TestEmptyDirMovesWithThePod(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		strategy migrate.Strategy
		medium   corev1.StorageMedium
	}{{migrate.MS2M, ""}, {migrate.MS2M, corev1.StorageMediumMemory}, {migrate.StopAndCopy, ""}} {
		t.Run(string(tc.strategy)+"/"+string(tc.medium), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			withScratch(t, w, tc.medium)
			rec, err := migrate.Run(context.Background(), testConfig(tc.strategy), w.Deps(), migrate.Hooks{})
			if err != nil {
				t.Fatal(err)
			}
			calls := strings.Join(w.Calls, "\n")
			snapshot := strings.Index(calls, "snapshot emptyDir [scratch] of 0b7c3d52-6b1a-4b9e-9a55-3f0d1c2e4a77 on node-a to /var/lib/kubelet/checkpoints/checkpoint-consumer_default-ms2m.volumes-abcde.tar")
			if snapshot < 0 || strings.Index(calls, "checkpoint default/consumer/app") > snapshot {
				t.Fatalf("no snapshot after the checkpoint:\n%s", calls)
			}
			if tc.strategy == migrate.MS2M {
				stop, resume := strings.Index(calls, "control consumer STOP"), strings.Index(calls, "control consumer RESUME")
				if stop < 0 || stop > strings.Index(calls, "checkpoint default/consumer/app") || resume < snapshot {
					t.Fatalf("the live source was not paused around checkpoint and snapshot:\n%s", calls)
				}
			}
			target, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(target.Spec.InitContainers) != 1 {
				t.Fatalf("target's init containers: %+v", target.Spec.InitContainers)
			}
			init := target.Spec.InitContainers[0]
			if init.Image != "registry:5000/ckpt/default/consumer:ms2m.volumes-abcde@sha256:abc" ||
				len(init.VolumeMounts) != 1 || init.VolumeMounts[0].Name != "scratch" || init.VolumeMounts[0].MountPath != "/ms2m/mnt/scratch" {
				t.Fatalf("init container %+v", init)
			}
			if v := target.Spec.Volumes; len(v) == 0 || v[len(v)-1].EmptyDir == nil || v[len(v)-1].EmptyDir.Medium != tc.medium {
				t.Fatalf("target volumes %+v", v)
			}
			if len(w.Archives) != 0 || len(w.Images) != 0 {
				t.Fatalf("left behind: archives %v images %v", w.Archives, w.Images)
			}
			if !strings.Contains(strings.Join(rec.Images, " "), "ms2m.volumes") {
				t.Fatalf("record's images %v", rec.Images)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEmptyDirMovesThroughTheRuntime: where the kubectl-migrate runtime
// restores, the emptyDir data is staged on the target before the
// checkpoint (the runtime restores a container once its checkpoint is
// staged, filling the volumes in that create), the target has no init
// container, and nothing is left staged, archived or in a registry.
func TestEmptyDirMovesThroughTheRuntime(t *testing.T) {
	t.Parallel()
	for _, strategy := range []migrate.Strategy{migrate.MS2M, migrate.StopAndCopy} {
		t.Run(string(strategy), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			withScratch(t, w, corev1.StorageMediumMemory)
			runtimeOnly(t, w, "node-a", "node-b")
			rec, err := migrate.Run(context.Background(), testConfig(strategy), w.Deps(), migrate.Hooks{})
			if err != nil || rec.Restore != string(migrate.RestoreRuntime) {
				t.Fatalf("%v, restored through %q", err, rec.Restore)
			}
			calls := strings.Join(w.Calls, "\n")
			volumes, app := strings.Index(calls, "stage /var/lib/kubectl-migrate/restore/default/consumer-abcde/ms2m.volumes\n"), strings.Index(calls, "stage /var/lib/kubectl-migrate/restore/default/consumer-abcde/app\n")
			if volumes < 0 || app < volumes || !strings.Contains(calls, "runtime fills the emptyDir volumes of consumer-abcde") {
				t.Fatalf("the emptyDir data was not staged before the checkpoint and filled by the runtime:\n%s", calls)
			}
			target, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{})
			if err != nil || slices.ContainsFunc(target.Spec.InitContainers, func(c corev1.Container) bool { return c.Name != migrate.AddressInitContainer }) {
				t.Fatalf("target's init containers: %+v (%v)", target.Spec.InitContainers, err)
			}
			if len(w.Archives) != 0 || len(w.Images) != 0 || len(w.Staged) != 0 || len(rec.Images) != 0 {
				t.Fatalf("left behind: archives %v images %v staged %v; record's images %v", w.Archives, w.Images, w.Staged, rec.Images)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEmptyDirRollsBack: a migration that fails after the snapshot leaves
// the source consuming and nothing of the snapshot anywhere.
func TestEmptyDirRollsBack(t *testing.T) {
	t.Parallel()
	for _, phase := range []report.PhaseName{report.Checkpoint, report.Image, report.Restore, report.Replay} {
		t.Run(string(phase), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			withScratch(t, w, "")
			w.FailAt = phase
			cfg := testConfig(migrate.MS2M)
			cfg.ReplayTimeout = 300e6
			if _, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{}); err == nil {
				t.Fatal("migration succeeded despite the failure")
			}
			if src := w.Apps["consumer"]; src.Mode != protocol.ModePrimary || src.PendingRestore {
				t.Fatalf("source not serving after rollback: %+v", src)
			}
			if len(w.Archives) != 0 || len(w.Images) != 0 {
				t.Fatalf("left behind: archives %v images %v", w.Archives, w.Images)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEmptyDirOverTheLimitIsRefused: data over --max-volume-data is refused
// in setup (the agent measures it), naming the flag, with nothing changed.
func TestEmptyDirOverTheLimitIsRefused(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	withScratch(t, w, "")
	w.VolumeBytes = 3 << 20
	cfg := testConfig(migrate.MS2M)
	cfg.MaxVolumeBytes = 2 << 20
	_, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "hold more than --max-volume-data (2Mi)") || !strings.HasPrefix(err.Error(), "setup:") {
		t.Fatalf("got %v", err)
	}
	if changes := w.Changes(); len(changes) != 0 || len(w.Records()) != 0 || len(w.Archives) != 0 {
		t.Fatalf("preflight changed something: %v", changes)
	}
}
