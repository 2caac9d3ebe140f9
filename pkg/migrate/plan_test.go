package migrate_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// TestPlanIsWhatRuns: for every strategy, mode and transfer, the dry-run
// plan has one line per phase the run then executes after preflight, in its
// order and stage, and each line names what that phase acts on.
func TestPlanIsWhatRuns(t *testing.T) {
	t.Parallel()
	type tc struct {
		name  string
		cfg   migrate.Config
		world func(*testing.T) *migratetest.World
		// words each plan line must hold, in order
		words []string
	}
	bare := func(s migrate.Strategy, transfer migrate.Transfer) migrate.Config {
		c := testConfig(s)
		c.Transfer = transfer
		return c
	}
	sts := func(s migrate.Strategy, mode migrate.StatefulSetMode) migrate.Config { return stsConfig(s, mode) }
	pod := func(t *testing.T) *migratetest.World { return migratetest.NewWorld(t) }
	set := func(t *testing.T) *migratetest.World { return migratetest.NewStatefulSetWorld(t) }
	withRuntime := func(t *testing.T) *migratetest.World {
		w := migratetest.NewWorld(t)
		node, err := w.Client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Labels = map[string]string{ociruntime.NodeLabel: "installed"}
		if _, err := w.Client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return w
	}
	throughRuntime := func(s migrate.Strategy) migrate.Config {
		c := bare(s, migrate.Direct)
		c.Restore = migrate.RestoreRuntime
		return c
	}
	for _, c := range []tc{
		{"pod/ms2m", bare(migrate.MS2M, migrate.ViaRegistry), pod,
			[]string{"bind replay queue", "checkpoint app of consumer on node-a", "pack and push", "restore pod consumer-abcde on node-b", "replay", "stop consumer; consumer-abcde", "delete pod consumer and the replay queue"}},
		{"pod/ms2m/direct", bare(migrate.MS2M, migrate.Direct), pod,
			[]string{"bind", "checkpoint", "stream the checkpoint archives from the agent on node-a to the agent on node-b", "restore", "replay", "stop", "delete"}},
		{"pod/ms2m/runtime", throughRuntime(migrate.MS2M), withRuntime,
			[]string{"create pod consumer-abcde on node-b from its own images under RuntimeClass kubectl-migrate", "checkpoint", "stages them for the kubectl-migrate runtime", "wait until pod consumer-abcde has restored", "replay", "stop", "delete"}},
		{"pod/stop-and-copy/runtime", throughRuntime(migrate.StopAndCopy), withRuntime,
			[]string{"holds its start until the checkpoint is staged, and wait for its address; stop consumer consuming", "checkpoint", "stages them", "wait until pod consumer-abcde", "consumer-abcde resumes", "delete"}},
		{"pod/stop-and-copy", bare(migrate.StopAndCopy, migrate.ViaRegistry), pod,
			[]string{"stop consumer consuming", "checkpoint", "pack and push", "restore pod consumer-abcde", "consumer-abcde resumes", "delete pod consumer"}},
		{"sts/ms2m/sequential", sts(migrate.MS2M, migrate.Sequential), set,
			[]string{"bind", "checkpoint", "pack", "stop consumer-0; delete statefulset consumer", "restore pod consumer-0 on node-b", "re-create statefulset consumer", "replay to consumer-0's last message", "consumer-0 takes over", "delete the replay queue"}},
		{"sts/stop-and-copy/sequential", sts(migrate.StopAndCopy, migrate.Sequential), set,
			[]string{"stop consumer-0 consuming", "checkpoint", "pack", "delete statefulset consumer", "restore pod consumer-0", "re-create", "consumer-0 resumes", "delete"}},
		{"sts/ms2m/shadow", sts(migrate.MS2M, migrate.Shadow), set,
			[]string{"[shadow] bind", "[shadow] checkpoint app of consumer-0 on node-a", "[shadow] pack", "[shadow] restore shadow pod consumer-0-shadow on node-b",
				"[shadow] replay", "[shadow] stop consumer-0; consumer-0-shadow", "[final] bind", "[final] checkpoint app of consumer-0-shadow on node-b", "[final] pack",
				"[final] delete statefulset consumer orphaning its pods; delete the stopped consumer-0", "[final] restore pod consumer-0 on node-b", "[final] re-create",
				"[final] replay buffered messages until consumer-0", "[final] stop consumer-0-shadow; consumer-0", "[final] delete pod consumer-0-shadow"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := c.world(t)
			plan := migrate.Plan(c.cfg, "node-a", []string{"app"})
			rec, err := migrate.Run(context.Background(), c.cfg, w.Deps(), migrate.Hooks{})
			if err != nil {
				t.Fatal(err)
			}
			ran := rec.Phases[2:] // after preflight and setup
			if len(plan) != len(ran) || len(plan) != len(c.words) {
				t.Fatalf("plan of %d lines, %d phases ran, %d expected:\n%s", len(plan), len(ran), len(c.words), strings.Join(plan, "\n"))
			}
			for i, line := range plan {
				if p := ran[i]; p.Stage != "" && !strings.HasPrefix(line, "["+p.Stage+"] ") {
					t.Errorf("line %d %q is not of stage %s, as phase %s", i, line, p.Stage, p.Label())
				}
				if !strings.Contains(line, c.words[i]) {
					t.Errorf("line %d %q, for phase %s, lacks %q", i, line, ran[i].Label(), c.words[i])
				}
			}
		})
	}
}
