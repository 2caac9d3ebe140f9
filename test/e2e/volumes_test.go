//go:build e2e

package e2e

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestEmptyDirMovesWithThePod migrates a live consumer that keeps a ledger
// file, open for appending, in an emptyDir: every value it applies is a line
// there as well as part of its sum in memory. After the move the restored
// process reads the file back on node-b: it must hold every applied message
// exactly once (as many lines as messages applied, summing to the sum in
// memory) — files and memory moved as of one moment — and conservation
// holds. Both transfers, both media, both strategies.
func TestEmptyDirMovesWithThePod(t *testing.T) {
	concurrent(t)
	for _, tc := range []struct {
		name, scratch string
		sidecar       bool
		flags         []string
	}{
		{"ms2m/registry/disk/sidecar", "disk", true, nil},
		{"ms2m/direct/memory", "memory", false, []string{"--transfer", "direct"}},
		{"stop-and-copy/registry/memory", "memory", false, []string{"--strategy", "stop-and-copy"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, w, rec, _, _ := migrateLiveApp(t, workload.Options{Rate: "10", Scratch: tc.scratch, Sidecar: tc.sidecar}, 30, tc.flags...)
			pod, err := l.client.CoreV1().Pods(w.Namespace).Get(context.Background(), rec.TargetPod, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			wantInits := 1
			if tc.sidecar {
				wantInits = 2 // the sidecar after the volumes are filled
				checkSidecarRunning(t, pod, 1)
			}
			if len(pod.Spec.InitContainers) != wantInits || !slices.Contains(rec.Images, pod.Spec.InitContainers[0].Image) {
				t.Fatalf("target's init containers %+v; the migration's images %v", pod.Spec.InitContainers, rec.Images)
			}
			volumeImage := pod.Spec.InitContainers[0].Image
			if len(pod.Status.InitContainerStatuses) != wantInits || pod.Status.InitContainerStatuses[0].State.Terminated == nil ||
				pod.Status.InitContainerStatuses[0].State.Terminated.ExitCode != 0 {
				t.Fatalf("the init container that fills the emptyDir: %+v", pod.Status.InitContainerStatuses)
			}
			t.Logf("filled by %s: %s", volumeImage, pod.Status.InitContainerStatuses[0].State.Terminated.Message)
			if !strings.HasPrefix(volumeImage, "localhost:") {
				if _, err := (image.Registry{Insecure: true}).Pull(context.Background(), volumeImage); err == nil {
					t.Errorf("the emptyDir image %s is still in the registry", volumeImage)
				}
			}
			checkConservation(t, w, rec.TargetPod)
			// A live source pauses for its checkpoint and snapshot: the
			// downtime beside the checkpoint phase says what that costs.
			ckpt, _ := rec.Phase(report.Checkpoint)
			t.Logf("downtime %d ms, checkpoint phase %d ms", rec.Downtime.Millis, ckpt.DurationMillis)
		})
	}
}

// TestEmptyDirOverTheLimitIsRefused: emptyDir data over --max-volume-data
// is refused before anything changes (exit 3, the flag named), and the
// consumer goes on applying every message.
func TestEmptyDirOverTheLimitIsRefused(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deployWith(t, workload.Options{Rate: "10", Scratch: "disk"})
	waitApplied(t, w, "consumer", 20)
	// The plan says what becomes of the volume.
	plan := l.kubectlMigrate(t, append(l.migrateArgs(w, "pod", "consumer", "--to", "node-b", "--dry-run"), "-o", "")[1:]...)
	if !strings.Contains(plan, "emptyDir scratch move with it") || !strings.Contains(plan, "the source stops consuming meanwhile") {
		t.Fatalf("the plan does not say the emptyDir moves:\n%s", plan)
	}
	_, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--max-volume-data", "100")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || !strings.Contains(stderr, "hold more than --max-volume-data (100)") {
		t.Fatalf("want exit 3 naming --max-volume-data, got %v:\n%s", err, stderr)
	}
	pods, err := l.client.CoreV1().Pods(w.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("pods after the refusal: %d, want the consumer and the producer", len(pods.Items))
	}
	l.noAgentsLeft(t, w.Namespace)
	checkConservation(t, w, "consumer")
}

// keepsALedger makes a StatefulSet's consumers keep a ledger of every value
// they apply in an emptyDir, which their conservation check reads.
func keepsALedger(_ string, sts *appsv1.StatefulSet) {
	spec := &sts.Spec.Template.Spec
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	c := &spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: "/scratch"})
	c.Args = append(c.Args, "--ledger=/scratch/ledger")
}

// TestStatefulSetShadowCarriesEmptyDir: in shadow mode the emptyDir moves
// twice, source → shadow → final pod, each time as of its checkpoint, and
// the final consumer-0's ledger file holds every applied message once.
func TestStatefulSetShadowCarriesEmptyDir(t *testing.T) {
	concurrent(t)
	rec := migrateStatefulSet(t, keepsALedger, "--mode", "shadow")
	// Each stage's checkpoint and volumes: four images.
	if len(rec.Images) != 4 {
		t.Fatalf("images %v, want a checkpoint and a volume image per stage", rec.Images)
	}
}

// checkSidecarRunning: the target pod's native sidecar (workload.Options.
// Sidecar) is its ith init container, started afresh and running.
func checkSidecarRunning(t testing.TB, pod *corev1.Pod, i int) {
	t.Helper()
	if len(pod.Spec.InitContainers) <= i || pod.Spec.InitContainers[i].Name != workload.SidecarName {
		t.Fatalf("%s has no sidecar as init container %d: %+v", pod.Name, i, pod.Spec.InitContainers)
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if st.Name == workload.SidecarName && st.State.Running != nil && st.Started != nil && *st.Started {
			return
		}
	}
	t.Fatalf("the sidecar of %s is not running: %+v", pod.Name, pod.Status.InitContainerStatuses)
}
