package migrate_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// contractless is a world whose application follows no contract (no
// control endpoint, no control token) and a checkpoint/restore migration
// of it, which names no broker.
func contractless(t *testing.T) (*migratetest.World, migrate.Config) {
	w := migratetest.NewWorld(t)
	dropContract(t, w)
	cfg := testConfig(migrate.CheckpointRestore)
	cfg.Broker = migrate.BrokerConfig{}
	return w, cfg
}

// dropContract makes w's applications follow no contract: no control
// endpoint, no control token.
func dropContract(t *testing.T, w *migratetest.World) {
	w.NoContract = true
	if err := w.Client.CoreV1().Secrets("default").Delete(context.Background(), protocol.ControlSecret, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointRestoreMovesAnyProcess: a pod without the MS2M contract
// moves with no broker and no call to the application: cut off the
// network, checkpointed, restored, and its copy gets the source's labels
// only after the commit; nothing it acknowledged is lost.
func TestCheckpointRestoreMovesAnyProcess(t *testing.T) {
	t.Parallel()
	for _, path := range restorePaths {
		t.Run(path.name, func(t *testing.T) {
			_, cfg := contractless(t)
			w := path.world(func(t *testing.T) *migratetest.World { w, _ := contractless(t); return w })(t)
			var restored map[string]string
			rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{PhaseFinished: func(p report.PhaseTiming, _ time.Duration, _ error) {
				if p.Name == report.Restore {
					if pod, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{}); err == nil {
						restored = pod.Labels
					}
				}
			}})
			if err != nil || rec.Outcome != report.Succeeded {
				t.Fatalf("%v %s", err, rec.Outcome)
			}
			if restored["app"] != "" {
				t.Fatalf("the copy was selectable before the commit: %v", restored)
			}
			ctx := context.Background()
			if _, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("source left: %v", err)
			}
			target, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{})
			if err != nil || target.Labels["app"] != "consumer" {
				t.Fatalf("the copy did not take the source's labels: %v %v", target, err)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
			changes := strings.Join(w.Changes(), "\n")
			if i, j := strings.Index(changes, "fence consumer on node-a (lift false)"), strings.Index(changes, "checkpoint default/consumer"); i < 0 || j < i {
				t.Fatalf("not cut off before its checkpoint:\n%s", changes)
			}
			if strings.Contains(changes, "control ") || w.Queues["work.ms2m-migration"] {
				t.Fatalf("the migration used the contract:\n%s", changes)
			}
			if rec.Downtime == nil || rec.Downtime.Millis < 0 {
				t.Fatalf("no downtime recorded: %+v", rec.Downtime)
			}
		})
	}
}

// TestCheckpointRestoreNeedsTheCut: without the cut, the source goes on
// after its checkpoint and what it acknowledged then is lost: the
// conservation check sees it, so the cut is what keeps it.
func TestCheckpointRestoreNeedsTheCut(t *testing.T) {
	t.Parallel()
	w, cfg := contractless(t)
	w.IsolationIgnored = true
	rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("%v %s", err, rec.Outcome)
	}
	if err := w.Conservation(); err == nil || !strings.Contains(err.Error(), "acknowledged") {
		t.Fatalf("a source left on the network lost nothing: %v", err)
	}
}

// TestCheckpointRestoreRollsBack: a failure at any phase before the commit
// leaves the source on its node, back on the network, and no copy.
func TestCheckpointRestoreRollsBack(t *testing.T) {
	t.Parallel()
	for _, phase := range []report.PhaseName{report.Stop, report.Checkpoint, report.Image, report.Restore} {
		t.Run(string(phase), func(t *testing.T) {
			w, cfg := contractless(t)
			w.FailAt = phase
			rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
			if err == nil || rec.Outcome != report.RolledBack {
				t.Fatalf("%v %s", err, rec.Outcome)
			}
			ctx := context.Background()
			if _, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("copy left: %v", err)
			}
			w.Mu.Lock()
			isolated := w.Isolated["consumer"]
			w.Mu.Unlock()
			if isolated {
				t.Fatal("the source is still cut off the network")
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCheckpointRestoreRefusesAContractPod: a consumer that follows the
// contract would be restored holding (no migration named its pod), so
// checkpoint/restore refuses it in preflight, changing nothing.
func TestCheckpointRestoreRefusesAContractPod(t *testing.T) {
	t.Parallel()
	w, cfg := contractless(t)
	ctx := context.Background()
	pod, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Annotations = map[string]string{migrate.QueueAnnotation: "work"}
	if _, err := w.Client.CoreV1().Pods("default").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	calls := len(w.Changes())
	_, err = migrate.Run(ctx, cfg, w.Deps(), migrate.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "follows the MS2M contract") || !strings.Contains(err.Error(), "--strategy ms2m") {
		t.Fatalf("got %v", err)
	}
	if changes := w.Changes()[calls:]; len(changes) != 0 || len(w.Records()) != 0 {
		t.Fatalf("preflight changed something: %v", changes)
	}
}

// TestCheckpointRestoreConfig: no broker needed; the contract's own
// options and a shadow copy (which replays) are refused with the reason.
func TestCheckpointRestoreConfig(t *testing.T) {
	cfg := testConfig(migrate.CheckpointRestore)
	cfg.Broker = migrate.BrokerConfig{}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("refused without a broker: %v", err)
	}
	ms2m := testConfig(migrate.MS2M)
	ms2m.Broker = migrate.BrokerConfig{}
	if err := ms2m.Validate(); err == nil || !strings.Contains(err.Error(), "--strategy checkpoint-restore") {
		t.Fatalf("MS2M without a broker: %v", err)
	}
	sts := cfg
	sts.StatefulSet, sts.TargetName, sts.Mode = "web", "consumer", migrate.Sequential
	if err := sts.Validate(); err != nil {
		t.Fatalf("a StatefulSet pod without the contract, sequential: %v", err)
	}
	sts.Mode = migrate.Shadow
	if err := sts.Validate(); err == nil || !strings.Contains(err.Error(), "needs --strategy ms2m") {
		t.Fatalf("a StatefulSet pod without the contract, through a shadow: %v", err)
	}
	cut := cfg
	cut.Cutoff = 1
	if err := cut.Validate(); err == nil || !strings.Contains(err.Error(), "--cutoff") {
		t.Fatalf("--cutoff: %v", err)
	}
}
