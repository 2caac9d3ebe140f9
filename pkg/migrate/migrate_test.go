package migrate

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

func testConfig(s Strategy) Config {
	return Config{
		ID: "abcde", Strategy: s, Namespace: "default", Pod: "consumer", TargetNode: "node-b", TargetName: "consumer-abcde",
		ImageRepository: "registry:5000/ckpt", AgentImage: "agent:1",
		Broker:      BrokerConfig{URL: "amqp://x", Exchange: "ex", Queue: "work"},
		ControlPort: 8080, CheckpointTimeout: time.Second, PhaseTimeout: 5 * time.Second, ReplayTimeout: 5 * time.Second, Timeout: time.Minute,
	}
}

func phaseNames(r *report.Record) []report.PhaseName {
	var names []report.PhaseName
	for _, p := range r.Phases {
		names = append(names, p.Name)
	}
	return names
}

func TestMS2MSucceeds(t *testing.T) {
	w := newWorld(t)
	rec, err := Run(context.Background(), testConfig(MS2M), w.deps(), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	want := []report.PhaseName{report.Preflight, report.Prepare, report.Checkpoint, report.Image, report.Restore, report.Replay, report.Switchover, report.Cleanup}
	if got := phaseNames(rec); !slices.Equal(got, want) {
		t.Fatalf("phases %v, want %v", got, want)
	}
	if rec.Outcome != report.Succeeded || rec.TotalMillis <= 0 {
		t.Fatalf("outcome %s total %d", rec.Outcome, rec.TotalMillis)
	}
	ctx := context.Background()
	if _, err := w.client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("source pod should be gone, got %v", err)
	}
	target, err := w.client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if target.Spec.NodeName != "node-b" || target.Spec.Containers[0].Image != "registry:5000/ckpt/consumer:app-abcde@sha256:abc" {
		t.Fatalf("target pod %s on %s with %s", target.Name, target.Spec.NodeName, target.Spec.Containers[0].Image)
	}
	if w.queues["work.ms2m-replay"] {
		t.Fatal("replay queue left behind")
	}
	if len(w.archives) != 0 {
		t.Fatalf("archives left on the node: %v", w.archives)
	}
	if w.apps["consumer-abcde"].Mode != ms2m.ModePrimary {
		t.Fatal("target does not own the primary queue")
	}
	// The marker must precede the checkpoint, and the source must be told
	// to stop before the target takes over.
	order := strings.Join(w.calls, "\n")
	if !(strings.Index(order, "bind work.ms2m-replay") < strings.Index(order, "marker abcde") &&
		strings.Index(order, "marker abcde") < strings.Index(order, "checkpoint default/consumer/app") &&
		strings.Index(order, "control consumer STOP") < strings.Index(order, "control consumer-abcde END_REPLAY")) {
		t.Fatalf("wrong order:\n%s", order)
	}
	if rec.Downtime == nil || rec.Downtime.Millis != 1500 {
		t.Fatalf("downtime %+v, want 1500 ms from the timestamps", rec.Downtime)
	}
	if rec.Broker.ReplayBacklog != 7 || rec.Broker.ArrivalRate <= 0 {
		t.Fatalf("broker figures %+v", rec.Broker)
	}
	if len(w.saved) != 1 || w.saved[0].Outcome != report.Succeeded {
		t.Fatalf("saved %v", w.saved)
	}
}

func TestStopAndCopySucceeds(t *testing.T) {
	w := newWorld(t)
	rec, err := Run(context.Background(), testConfig(StopAndCopy), w.deps(), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	want := []report.PhaseName{report.Preflight, report.Stop, report.Checkpoint, report.Image, report.Restore, report.Switchover, report.Cleanup}
	if got := phaseNames(rec); !slices.Equal(got, want) {
		t.Fatalf("phases %v, want %v", got, want)
	}
	if slices.ContainsFunc(w.calls, func(c string) bool { return strings.HasPrefix(c, "bind") }) {
		t.Fatal("stop-and-copy must not bind a replay queue")
	}
	if !strings.HasPrefix(w.calls[0], "control consumer STOP") {
		t.Fatalf("stop-and-copy must stop the source first, did %q", w.calls[0])
	}
}

// TestRollbackAtEveryPhase fails each phase in turn and checks that the
// source keeps serving and nothing the migration created is left.
func TestRollbackAtEveryPhase(t *testing.T) {
	for _, tc := range []struct {
		strategy Strategy
		phase    report.PhaseName
	}{
		{MS2M, report.Preflight}, {MS2M, report.Prepare}, {MS2M, report.Checkpoint}, {MS2M, report.Image},
		{MS2M, report.Restore}, {MS2M, report.Replay}, {MS2M, report.Switchover},
		{StopAndCopy, report.Checkpoint}, {StopAndCopy, report.Image}, {StopAndCopy, report.Restore},
	} {
		t.Run(string(tc.strategy)+"/"+string(tc.phase), func(t *testing.T) {
			w := newWorld(t)
			w.failAt = tc.phase
			cfg := testConfig(tc.strategy)
			cfg.ReplayTimeout = 300 * time.Millisecond
			cfg.PhaseTimeout = 2 * time.Second
			rec, err := Run(context.Background(), cfg, w.deps(), Hooks{})
			if err == nil {
				t.Fatal("migration succeeded despite the failure")
			}
			if !strings.HasPrefix(err.Error(), string(tc.phase)+":") {
				t.Fatalf("error does not name the phase: %v", err)
			}
			ctx := context.Background()
			if _, err := w.client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{}); err != nil {
				t.Fatalf("source pod: %v", err)
			}
			if _, err := w.client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("target pod left behind: %v", err)
			}
			if src := w.apps["consumer"]; src.Mode != ms2m.ModePrimary || src.PendingRestore {
				t.Fatalf("source not serving after rollback: %+v", src)
			}
			if w.queues["work.ms2m-replay"] || len(w.archives) > 0 || len(w.images) > 0 {
				t.Fatalf("left behind: queues %v archives %v images %v", w.queues, w.archives, w.images)
			}
			if tc.phase == report.Preflight {
				if len(w.saved) != 0 {
					t.Fatal("a failed preflight must not write to the cluster")
				}
				return
			}
			if rec.Outcome != report.RolledBack || len(w.saved) != 1 {
				t.Fatalf("outcome %s, saved %d", rec.Outcome, len(w.saved))
			}
		})
	}
}

func TestKeepOnFailureLeavesWreckage(t *testing.T) {
	w := newWorld(t)
	w.failAt = report.Replay
	cfg := testConfig(MS2M)
	cfg.ReplayTimeout, cfg.KeepOnFailure = 200*time.Millisecond, true
	rec, err := Run(context.Background(), cfg, w.deps(), Hooks{})
	if err == nil || rec.Outcome != report.Failed {
		t.Fatalf("err %v outcome %s", err, rec.Outcome)
	}
	if _, err := w.client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{}); err != nil {
		t.Fatalf("target pod should be kept: %v", err)
	}
	if !w.queues["work.ms2m-replay"] {
		t.Fatal("replay queue should be kept")
	}
}

func TestFailureAfterCommitDoesNotRollBack(t *testing.T) {
	w := newWorld(t)
	w.failAt = report.Cleanup
	rec, err := Run(context.Background(), testConfig(MS2M), w.deps(), Hooks{})
	if !errors.Is(err, ErrCommitted) || rec.Outcome != report.Committed {
		t.Fatalf("err %v outcome %s", err, rec.Outcome)
	}
	if w.apps["consumer-abcde"].Mode != ms2m.ModePrimary {
		t.Fatal("the target must keep the primary queue")
	}
}

func TestInterruptRollsBack(t *testing.T) {
	w := newWorld(t)
	w.failAt = report.Replay // replay never finishes; the user presses Ctrl-C
	ctx, cancel := context.WithCancel(context.Background())
	var rolledBack bool
	hooks := Hooks{
		PhaseStarted: func(p report.PhaseName) {
			if p == report.Replay {
				go func() { time.Sleep(50 * time.Millisecond); cancel() }()
			}
		},
		RollbackStarted: func(error) { rolledBack = true },
	}
	rec, err := Run(ctx, testConfig(MS2M), w.deps(), hooks)
	if err == nil || !rolledBack || rec.Outcome != report.RolledBack {
		t.Fatalf("err %v rolledBack %v outcome %s", err, rolledBack, rec.Outcome)
	}
	if _, err := w.client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatal("target pod left behind after interrupt")
	}
}

func TestPreflightRefusals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*world, *Config)
		want   string
	}{
		{"same node", func(_ *world, c *Config) { c.TargetNode = "node-a" }, "already runs on node node-a"},
		{"unknown node", func(_ *world, c *Config) { c.TargetNode = "node-z" }, "node node-z not found"},
		{"missing pod", func(_ *world, c *Config) { c.Pod = "nope" }, "pod nope not found"},
		{"unknown container", func(_ *world, c *Config) { c.Containers = []string{"sidecar"} }, `no container "sidecar"`},
		{"containerd 2.4 target", func(w *world, _ *Config) {
			n, _ := w.client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{})
			n.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.4.0"
			_, _ = w.client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		}, "cannot restore checkpoints"},
		{"replay queue exists", func(w *world, _ *Config) { w.queues["work.ms2m-replay"] = true }, "already exists"},
		{"app not serving", func(w *world, _ *Config) { w.apps["consumer"].Mode = ms2m.ModeHold }, "hold mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			cfg := testConfig(MS2M)
			tc.mutate(w, &cfg)
			before := len(w.calls)
			_, err := Run(context.Background(), cfg, w.deps(), Hooks{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if len(w.calls) != before || len(w.saved) != 0 {
				t.Fatalf("preflight changed something: %v", w.calls[before:])
			}
		})
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	w := newWorld(t)
	cfg := testConfig(MS2M)
	cfg.DryRun = true
	rec, err := Run(context.Background(), cfg, w.deps(), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Phases) != 1 || len(w.calls) != 0 || len(w.saved) != 0 {
		t.Fatalf("dry run did %v", w.calls)
	}
}
