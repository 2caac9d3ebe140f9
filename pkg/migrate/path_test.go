package migrate_test

import (
	"cmp"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// checkpointPaths are the ways a checkpoint travels and is restored (the
// engine's checkpointPath), each as a world and a configuration choose it.
var checkpointPaths = []struct {
	name  string
	setUp func(t *testing.T, w *migratetest.World, cfg *migrate.Config)
	// image is what the target's container runs ("": the source's own
	// image, restored by the kubectl-migrate runtime).
	image string
}{
	{"registry", func(*testing.T, *migratetest.World, *migrate.Config) {}, "registry:5000/ckpt/default/consumer:app-abcde@sha256:abc"},
	{"agent-pull", func(_ *testing.T, _ *migratetest.World, cfg *migrate.Config) {
		cfg.Transfer, cfg.ImageRepository = migrate.Direct, ""
	}, "localhost:8091/default/consumer:app-abcde@sha256:abc"},
	{"staged", func(t *testing.T, w *migratetest.World, cfg *migrate.Config) {
		node, err := w.Client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.4.2"
		node.Labels = map[string]string{ociruntime.NodeLabel: "installed"}
		if _, err := w.Client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}, ""},
}

// TestEachCheckpointPath: on each path a migration restores the target
// from where that path put the checkpoint, and leaves nothing of the
// checkpoint behind, whether it succeeds or rolls back from each phase
// after the pack; a registry is asked for nothing unless the path is the
// registry's.
func TestEachCheckpointPath(t *testing.T) {
	t.Parallel()
	for _, p := range checkpointPaths {
		for _, failAt := range []report.PhaseName{"", report.Restore, report.Replay} {
			t.Run(p.name+"/"+cmp.Or(string(failAt), "succeeds"), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				w := migratetest.NewWorld(t)
				w.FailAt = failAt
				cfg := testConfig(migrate.MS2M)
				p.setUp(t, w, &cfg)
				var target *corev1.Pod
				rec, err := migrate.Run(ctx, cfg, w.Deps(), migrate.Hooks{})
				want := report.Succeeded
				if failAt != "" {
					want = report.RolledBack
				}
				if rec.Outcome != want {
					t.Fatalf("outcome %s, want %s: %v", rec.Outcome, want, err)
				}
				calls := strings.Join(w.Calls, "\n")
				if p.name != "registry" && (strings.Contains(calls, "delete image") || strings.Contains(calls, "push ")) {
					t.Errorf("a registry was asked for something:\n%s", calls)
				}
				if failAt == "" {
					var err error
					target, err = w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if p.image != "" && target.Spec.Containers[0].Image != p.image {
						t.Errorf("the target runs %s, want %s", target.Spec.Containers[0].Image, p.image)
					}
					if runtime := target.Spec.RuntimeClassName; (runtime != nil) != (p.image == "") {
						t.Errorf("the target's RuntimeClass %v", runtime)
					}
				}
				// What a receiving agent holds goes with it: every agent
				// ended, none of the rest may stay.
				if agents := w.AgentRequests(); len(agents) != 0 {
					t.Errorf("agents left: %v", agents)
				}
				w.Mu.Lock()
				left := len(w.Staged) + len(w.Expected) + len(w.Archives)
				for ref := range w.Images {
					if !strings.HasPrefix(ref, agent.DirectRegistry()+"/") {
						left++
					}
				}
				w.Mu.Unlock()
				if left != 0 {
					t.Errorf("left of the checkpoint: images %v, staged %v, expected %v, archives %v", w.Images, w.Staged, w.Expected, w.Archives)
				}
				secrets, err := w.Client.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range secrets.Items {
					// A pull secret goes with its pod, which the fake
					// clientset does not collect: only an owned one may
					// stay.
					if s.Name != protocol.ControlSecret && (target == nil || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != target.UID) {
						t.Errorf("secret %s left", s.Name)
					}
				}
				if err := w.Conservation(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
