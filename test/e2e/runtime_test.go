//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// The restore path that needs no CRI restore: the kubectl-migrate runtime,
// selected by its RuntimeClass, restores the target container from the
// checkpoint the target's agent staged, with no image anywhere.

func runtimeRestored(pod *corev1.Pod) bool {
	return pod.Spec.RuntimeClassName != nil && *pod.Spec.RuntimeClassName == ociruntime.HandlerName
}

// nothingStaged checks that no checkpoint is left in node's stage.
func (l *lab) nothingStaged(t testing.TB, node string) {
	t.Helper()
	stage := filepath.Join(env(t, "LAB_RUN"), node, "upper", ociruntime.StageDir)
	var left []string
	_ = filepath.WalkDir(stage, func(path string, d os.DirEntry, err error) error {
		if err == nil && path != stage && d.IsDir() {
			if rel, _ := filepath.Rel(stage, path); strings.Count(rel, "/") == 2 { // NAMESPACE/POD/CONTAINER
				left = append(left, rel)
			}
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("checkpoints left staged on %s: %v", node, left)
	}
}

// TestRuntimeRestoreMigratesALivePod migrates the live consumer with
// --restore runtime, as MS2M and as stop-and-copy: restored (same process,
// state continued), every message applied exactly once, nothing staged
// left and no image made.
func TestRuntimeRestoreMigratesALivePod(t *testing.T) {
	for _, strategy := range []string{"ms2m", "stop-and-copy"} {
		t.Run(strategy, func(t *testing.T) {
			_, w, rec := migrateLivePod(t, "--restore", "runtime", "--strategy", strategy)
			checkConservation(t, w, rec.TargetPod)
			t.Logf("runtime restore, %s: critical path %d ms, total %d ms, downtime %d ms", strategy, rec.CriticalPathMillis(), rec.TotalMillis, rec.Downtime.Millis)
		})
	}
}
