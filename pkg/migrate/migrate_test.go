package migrate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Every test of the package calls t.Parallel: each builds a World of its
// own and the engine keeps no state between migrations, and the suite waits
// on the engine's polls far more than it computes (half the wall time, run
// one at a time).

func testConfig(s migrate.Strategy) migrate.Config {
	return migrate.Config{
		ID: "abcde", Strategy: s, Namespace: "default", Pod: "consumer", TargetNode: "node-b", TargetName: "consumer-abcde",
		ImageRepository: "registry:5000/ckpt", AgentImage: "agent:1", AllowAnonymousCheckpoints: true,
		Broker:      migrate.BrokerConfig{URL: "amqp://x", Exchange: "ex", Queue: "work"},
		ControlPort: 8080, CheckpointTimeout: time.Second, PhaseTimeout: 5 * time.Second, ReplayTimeout: 5 * time.Second, Timeout: time.Minute,
		PredictWindow: -1, // TestMigrationKeepsItsPrediction predicts
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
	t.Parallel()
	w := migratetest.NewWorld(t)
	rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	want := []report.PhaseName{report.Preflight, report.Setup, report.Prepare, report.Checkpoint, report.Image, report.Restore, report.Replay, report.Switchover, report.Cleanup}
	if got := phaseNames(rec); !slices.Equal(got, want) {
		t.Fatalf("phases %v, want %v", got, want)
	}
	if rec.Outcome != report.Succeeded || rec.TotalMillis <= 0 {
		t.Fatalf("outcome %s total %d", rec.Outcome, rec.TotalMillis)
	}
	ctx := context.Background()
	if _, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("source pod should be gone, got %v", err)
	}
	target, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if target.Spec.NodeName != "node-b" || target.Spec.Containers[0].Image != "registry:5000/ckpt/default/consumer:app-abcde@sha256:abc" {
		t.Fatalf("target pod %s on %s with %s", target.Name, target.Spec.NodeName, target.Spec.Containers[0].Image)
	}
	if w.Queues["work.ms2m-replay"] {
		t.Fatal("replay queue left behind")
	}
	if len(w.Archives) != 0 {
		t.Fatalf("archives left on the node: %v", w.Archives)
	}
	if w.Apps["consumer-abcde"].Mode != protocol.ModePrimary {
		t.Fatal("target does not own the primary queue")
	}
	// The marker must precede the checkpoint, and the source must be told
	// to stop before the target takes over.
	order := strings.Join(w.Calls, "\n")
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
	if saved := w.Records(); len(saved) != 1 || saved[0].Outcome != report.Succeeded || len(saved[0].Journal) != 0 {
		t.Fatalf("saved %+v", saved)
	}
	if leases := w.Leases(); len(leases) != 0 {
		t.Fatalf("leases left: %v", leases)
	}
}

// Checkpoint images hold the process's memory: they are deleted after
// success unless asked for, and live under the pod's namespace.
func TestImagesDeletedAfterSuccessUnlessKept(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		w := migratetest.NewWorld(t)
		cfg := testConfig(migrate.MS2M)
		cfg.KeepImages = keep
		rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
		if err != nil {
			t.Fatal(err)
		}
		if keep != (len(w.Images) == 1) {
			t.Fatalf("keep %v: checkpoint images left: %v", keep, w.Images)
		}
		if len(rec.Images) != 1 || !strings.HasPrefix(rec.Images[0], "registry:5000/ckpt/default/consumer:") {
			t.Fatalf("images %v, want them under the namespace", rec.Images)
		}
	}
}

// A target that cannot catch up (its replay never reaches the source) still
// completes with a cutoff: the source stops and the target takes over.
func TestCutoffEndsAReplayThatCannotCatchUp(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	w.FailAt = report.Replay
	cfg := testConfig(migrate.MS2M)
	cfg.Cutoff = time.Millisecond
	rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Cutoff == nil || !rec.Cutoff.Fired || rec.Cutoff.FixedMillis != 1 || rec.Outcome != report.Succeeded {
		t.Fatalf("cutoff %+v outcome %s", rec.Cutoff, rec.Outcome)
	}
}

func TestCutoffNeedsMS2M(t *testing.T) {
	t.Parallel()
	cfg := testConfig(migrate.StopAndCopy)
	cfg.ReplayMax = time.Second
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "only apply to --strategy ms2m") {
		t.Fatalf("got %v", err)
	}
	cfg = testConfig(migrate.MS2M)
	cfg.ReplayMax, cfg.Cutoff = time.Second, time.Second
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Fatalf("got %v", err)
	}
}

func TestStopAndCopySucceeds(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	rec, err := migrate.Run(context.Background(), testConfig(migrate.StopAndCopy), w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	want := []report.PhaseName{report.Preflight, report.Setup, report.Stop, report.Checkpoint, report.Image, report.Restore, report.Switchover, report.Cleanup}
	if got := phaseNames(rec); !slices.Equal(got, want) {
		t.Fatalf("phases %v, want %v", got, want)
	}
	if slices.ContainsFunc(w.Calls, func(c string) bool { return strings.HasPrefix(c, "bind") }) {
		t.Fatal("stop-and-copy must not bind a replay queue")
	}
	// After setup's agents and the mark that a migration runs.
	changes := w.Changes()
	first := slices.IndexFunc(changes, func(c string) bool { return !strings.HasPrefix(c, "declare ") }) // after the mark that a migration runs
	if !strings.HasPrefix(changes[first], "control consumer STOP") {
		t.Fatalf("stop-and-copy must stop the source first, did %q", changes[first])
	}
}

// TestRollbackAtEveryPhase fails each phase in turn and checks that the
// source keeps serving and nothing the migration created is left.
func TestRollbackAtEveryPhase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		strategy migrate.Strategy
		phase    report.PhaseName
	}{
		{migrate.MS2M, report.Preflight}, {migrate.MS2M, report.Setup}, {migrate.MS2M, report.Prepare}, {migrate.MS2M, report.Checkpoint}, {migrate.MS2M, report.Image},
		{migrate.MS2M, report.Restore}, {migrate.MS2M, report.Replay}, {migrate.MS2M, report.Switchover},
		{migrate.StopAndCopy, report.Checkpoint}, {migrate.StopAndCopy, report.Image}, {migrate.StopAndCopy, report.Restore},
	} {
		t.Run(string(tc.strategy)+"/"+string(tc.phase), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			w.FailAt = tc.phase
			cfg := testConfig(tc.strategy)
			cfg.ReplayTimeout = 300 * time.Millisecond
			cfg.PhaseTimeout = 2 * time.Second
			rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
			if err == nil {
				t.Fatal("migration succeeded despite the failure")
			}
			if !strings.HasPrefix(err.Error(), string(tc.phase)+":") {
				t.Fatalf("error does not name the phase: %v", err)
			}
			ctx := context.Background()
			if _, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{}); err != nil {
				t.Fatalf("source pod: %v", err)
			}
			if _, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("target pod left behind: %v", err)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
			if src := w.Apps["consumer"]; src.Mode != protocol.ModePrimary || src.PendingRestore {
				t.Fatalf("source not serving after rollback: %+v", src)
			}
			if w.Queues["work.ms2m-replay"] || w.Queues["work.ms2m-migration"] || len(w.Archives) > 0 || len(w.Images) > 0 {
				t.Fatalf("left behind: queues %v archives %v images %v", w.Queues, w.Archives, w.Images)
			}
			if tc.phase == report.Preflight || tc.phase == report.Setup {
				// Refused before anything of the workload changed: no
				// record, no lock, no agent, no probe queue.
				w.Mu.Lock()
				probes := w.Queues["work.ms2m-probe-abcde"]
				w.Mu.Unlock()
				agents := slices.Contains(w.Calls, "release agents") || !slices.ContainsFunc(w.Calls, func(c string) bool { return strings.HasPrefix(c, "warm agent ") })
				if len(w.Records()) != 0 || len(w.Leases()) != 0 || probes || !agents || !rec.ChangedNothing() {
					t.Fatalf("a failed %s left something: records %d, leases %v, probe queue %t, agents released %t", tc.phase, len(w.Records()), w.Leases(), probes, agents)
				}
				return
			}
			saved := w.Records()
			if rec.Outcome != report.RolledBack || len(saved) != 1 || saved[0].Outcome != report.RolledBack || len(w.Leases()) != 0 {
				t.Fatalf("outcome %s, saved %+v, leases %v", rec.Outcome, saved, w.Leases())
			}
		})
	}
}

func TestKeepOnFailureLeavesWreckage(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	w.FailAt = report.Replay
	cfg := testConfig(migrate.MS2M)
	cfg.ReplayTimeout, cfg.KeepOnFailure = 200*time.Millisecond, true
	rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
	if err == nil || rec.Outcome != report.Failed {
		t.Fatalf("err %v outcome %s", err, rec.Outcome)
	}
	if _, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{}); err != nil {
		t.Fatalf("target pod should be kept: %v", err)
	}
	if !w.Queues["work.ms2m-replay"] {
		t.Fatal("replay queue should be kept")
	}
}

func TestFailureAfterCommitDoesNotRollBack(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	w.FailAt = report.Cleanup
	rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
	if !errors.Is(err, migrate.ErrCommitted) || rec.Outcome != report.Committed {
		t.Fatalf("err %v outcome %s", err, rec.Outcome)
	}
	if w.Apps["consumer-abcde"].Mode != protocol.ModePrimary {
		t.Fatal("the target must keep the primary queue")
	}
}

func TestInterruptRollsBack(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	w.FailAt = report.Replay // replay never finishes; the user presses Ctrl-C
	ctx, cancel := context.WithCancel(context.Background())
	var rolledBack bool
	hooks := migrate.Hooks{
		PhaseStarted: func(p report.PhaseTiming) {
			if p.Name == report.Replay {
				go func() { time.Sleep(50 * time.Millisecond); cancel() }()
			}
		},
		RollbackStarted: func(error) { rolledBack = true },
	}
	rec, err := migrate.Run(ctx, testConfig(migrate.MS2M), w.Deps(), hooks)
	if err == nil || !rolledBack || rec.Outcome != report.RolledBack {
		t.Fatalf("err %v rolledBack %v outcome %s", err, rolledBack, rec.Outcome)
	}
	if _, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatal("target pod left behind after interrupt")
	}
}

func TestPreflightRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		mutate func(*migratetest.World, *migrate.Config)
		want   string
	}{
		{"same node", func(_ *migratetest.World, c *migrate.Config) { c.TargetNode = "node-a" }, "already runs on node node-a"},
		{"unknown node", func(_ *migratetest.World, c *migrate.Config) { c.TargetNode = "node-z" }, "node node-z not found"},
		{"missing pod", func(_ *migratetest.World, c *migrate.Config) { c.Pod = "nope" }, "pod nope not found"},
		{"unknown container", func(_ *migratetest.World, c *migrate.Config) { c.Containers = []string{"sidecar"} }, `no container "sidecar"`},
		{"sidecar named", func(w *migratetest.World, c *migrate.Config) {
			p, _ := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer", metav1.GetOptions{})
			p.Spec.InitContainers = []corev1.Container{{Name: "log-shipper", Image: "shipper:1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
			_, _ = w.Client.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{})
			c.Containers = []string{"log-shipper"}
		}, `"log-shipper" is an init container of pod consumer`},
		{"containerd 2.4 target", func(w *migratetest.World, _ *migrate.Config) {
			n, _ := w.Client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{})
			n.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.4.0"
			_, _ = w.Client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		}, "cannot restore checkpoints"},
		{"containerd target with restore left at its default", func(w *migratetest.World, _ *migrate.Config) {
			n, _ := w.Client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{})
			n.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.3.7"
			_, _ = w.Client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
			w.RuntimeConfig = map[string]string{"node-b": `{"enableCRIU":true,"enableExperimentalRestoreViaCreate":false}`}
		}, "enable_experimental_restore_via_create = true"},
		{"agents' namespace made by someone else", func(w *migratetest.World, _ *migrate.Config) {
			_, _ = w.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: agent.DefaultNamespace}}, metav1.CreateOptions{})
		}, "the agents' namespace kubectl-migrate-system was not made by kubectl migrate"},
		{"agents' namespace another can act in", func(w *migratetest.World, _ *migrate.Config) {
			_, _ = w.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
				Name: agent.DefaultNamespace, Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}}}, metav1.CreateOptions{})
			for name, role := range map[string]rbacv1.RoleRef{
				"migrators": {Kind: "Role", Name: agent.AgentsRole},
				"squatter":  {Kind: "ClusterRole", Name: "admin"},
			} {
				_, _ = w.Client.RbacV1().RoleBindings(agent.DefaultNamespace).Create(context.Background(), &rbacv1.RoleBinding{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: agent.DefaultNamespace},
					RoleRef:    role,
					Subjects:   []rbacv1.Subject{{Kind: "User", Name: "mallory"}},
				}, metav1.CreateOptions{})
			}
		}, "grants more than Role kubectl-migrate-agents, so others can act where the agents run as root: RoleBinding squatter (ClusterRole admin to User mallory); have an administrator remove them"},
		{"no agents' controller", func(w *migratetest.World, _ *migrate.Config) { w.ControllerDown = true },
			"the agents' controller has never run in namespace kubectl-migrate-system: have an administrator install it with kubectl migrate node-setup --agents-only"},
		{"pod on the node's network", func(w *migratetest.World, _ *migrate.Config) {
			p, _ := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer", metav1.GetOptions{})
			p.Spec.HostNetwork = true
			_, _ = w.Client.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{})
		}, "pod consumer cannot be moved by a checkpoint: it runs on the node's network (hostNetwork)"},
		{"pod holding a GPU", func(w *migratetest.World, _ *migrate.Config) {
			p, _ := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer", metav1.GetOptions{})
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
			_, _ = w.Client.CoreV1().Pods("default").Update(context.Background(), p, metav1.UpdateOptions{})
		}, "uses the device nvidia.com/gpu: CRIU cannot checkpoint a device's state"},
		{"replay queue exists", func(w *migratetest.World, _ *migrate.Config) { w.Queues["work.ms2m-replay"] = true }, "already exists"},
		{"app not serving", func(w *migratetest.World, _ *migrate.Config) { w.Apps["consumer"].Mode = protocol.ModeHold }, "hold mode"},
		{"checkpoint image pulled without credentials", func(_ *migratetest.World, c *migrate.Config) { c.AllowAnonymousCheckpoints = false }, "pass --registry-secret for a registry that asks for credentials, --transfer direct, or --allow-anonymous-checkpoints"},
		{"app of a newer contract", func(w *migratetest.World, _ *migrate.Config) {
			w.Apps["consumer"].Contract = protocol.ContractVersion + 1
		}, "upgrade kubectl-migrate"},
		{"app whose endpoint takes anyone's calls", func(w *migratetest.World, _ *migrate.Config) { w.Apps["consumer"].Contract = 3 }, "takes calls from any pod of the cluster; upgrade it to version 4"},
		{"no control token", func(w *migratetest.World, _ *migrate.Config) {
			_ = w.Client.CoreV1().Secrets("default").Delete(context.Background(), protocol.ControlSecret, metav1.DeleteOptions{})
		}, "namespace default has no Secret ms2m-control"},
		{"a control token that is not the application's", func(w *migratetest.World, _ *migrate.Config) {
			_, _ = w.Client.CoreV1().Secrets("default").Update(context.Background(), &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: protocol.ControlSecret, Namespace: "default"},
				Data:       map[string][]byte{protocol.TokenKey: []byte("changed")},
			}, metav1.UpdateOptions{})
		}, "refused the call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := migratetest.NewWorld(t)
			cfg := testConfig(migrate.MS2M)
			tc.mutate(w, &cfg)
			_, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if changes := w.Changes(); len(changes) != 0 || len(w.Records()) != 0 || len(w.Leases()) != 0 {
				t.Fatalf("preflight changed something: %v", changes)
			}
		})
	}
}

func TestDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	cfg := testConfig(migrate.MS2M)
	cfg.DryRun = true
	rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	// Only the agents ran, to prove they can.
	agentsOnly := len(w.Changes()) == 0 && slices.Contains(w.Calls, "release agents")
	if len(rec.Phases) != 2 || !agentsOnly || len(w.Records()) != 0 || len(w.Leases()) != 0 {
		t.Fatalf("dry run did %v", w.Calls)
	}
}

func TestRecordTimesTheCriticalPath(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	steps := map[report.StepName]bool{}
	for _, p := range rec.Phases {
		for _, s := range p.Steps {
			steps[s.Name] = true
		}
	}
	for _, name := range []report.StepName{report.AgentsReady, report.BasePull, report.CheckpointCall, report.Pack, report.Push, report.PodCreate, report.PodRunning, report.AppHolding} {
		if !steps[name] {
			t.Errorf("no %q step in %+v", name, rec.Phases)
		}
	}
	path, overhead := rec.CriticalPathMillis(), rec.OverheadMillis()
	cp, _ := rec.Phase(report.Checkpoint)
	rs, _ := rec.Phase(report.Restore)
	if path != rs.StartMillis+rs.DurationMillis-cp.StartMillis || overhead > path {
		t.Fatalf("critical path %d ms, overhead %d ms, phases %+v", path, overhead, rec.Phases)
	}
}

// TestDirectTransferNeedsNoRegistry: with --transfer direct the target's
// agent receives the checkpoint, its runtime is proven to pull from that
// agent in preflight, the restored pod runs the image from its own node,
// and no registry is ever asked for anything.
func TestDirectTransferNeedsNoRegistry(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	cfg := testConfig(migrate.MS2M)
	cfg.Transfer, cfg.ImageRepository = migrate.Direct, ""
	rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	calls := strings.Join(w.Calls, "\n")
	for _, want := range []string{"on node-b (direct true)", "on node-a (direct false)", "prepull [localhost:8091/kubectl-migrate/probe:ready] on node-b", "send to 192.0.2.98:8093 as default/consumer:app-abcde"} {
		if !strings.Contains(calls, want) {
			t.Errorf("no %q in:\n%s", want, calls)
		}
	}
	if strings.Contains(calls, "delete image") {
		t.Errorf("a registry was asked to delete:\n%s", calls)
	}
	target, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{})
	if err != nil || target.Spec.Containers[0].Image != "localhost:8091/default/consumer:app-abcde@sha256:abc" {
		t.Fatalf("target %v: %v", target, err)
	}
	if rec.Outcome != report.Succeeded {
		t.Fatalf("outcome %s", rec.Outcome)
	}
	// The target pulls with a secret of its own, for its node's agent
	// only, which it owns.
	const secretName = "kubectl-migrate-pull-abcde-node-b"
	if !slices.Contains(target.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: secretName}) {
		t.Fatalf("the target pulls with %v", target.Spec.ImagePullSecrets)
	}
	secret, err := w.Client.CoreV1().Secrets("default").Get(context.Background(), secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var config struct {
		Auths map[string]struct{ Username, Password string }
	}
	if err := json.Unmarshal(secret.Data[corev1.DockerConfigJsonKey], &config); err != nil || len(config.Auths) != 1 ||
		config.Auths["localhost:8091"].Username != agent.PullUser || len(config.Auths["localhost:8091"].Password) != 64 {
		t.Fatalf("pull secret %s: %v", secret.Data, err)
	}
	if owners := secret.OwnerReferences; len(owners) != 1 || owners[0].Kind != "Pod" || owners[0].UID != target.UID || target.UID == "" {
		t.Fatalf("the pull secret's owners %+v, the target's UID %q", owners, target.UID)
	}
}

// TestDirectTransferRollbackLeavesNoPullSecret: a restore undone takes the
// pull secret it wrote with the target.
func TestDirectTransferRollbackLeavesNoPullSecret(t *testing.T) {
	t.Parallel()
	for _, phase := range []report.PhaseName{report.Restore, report.Replay} {
		t.Run(string(phase), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			w.FailAt = phase
			cfg := testConfig(migrate.MS2M)
			cfg.Transfer, cfg.ImageRepository = migrate.Direct, ""
			rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
			if err == nil || rec.Outcome != report.RolledBack {
				t.Fatalf("outcome %s: %v", rec.Outcome, err)
			}
			secrets, err := w.Client.CoreV1().Secrets("default").List(context.Background(), metav1.ListOptions{})
			if err != nil || len(secrets.Items) != 1 || secrets.Items[0].Name != protocol.ControlSecret {
				t.Fatalf("left %d secrets beside the control token (%v)", len(secrets.Items)-1, err)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRollbackWithTheRegistryGone: the target cannot pull because the
// registry went away, and the rollback cannot delete the pushed image
// either. The rollback still ends (the source serves, nothing of the
// migration runs, the archive is gone) and the record names the image to
// delete by hand.
func TestRollbackWithTheRegistryGone(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	w.FailAt, w.RegistryDown = report.Restore, true
	rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
	if err == nil {
		t.Fatal("the migration succeeded")
	}
	if rec.Outcome != report.RolledBack || len(rec.Leftovers) != 1 || !strings.Contains(rec.Leftovers[0], "registry:5000/ckpt/default/consumer:app-abcde@sha256:abc") {
		t.Fatalf("outcome %s, leftovers %v", rec.Outcome, rec.Leftovers)
	}
	if src := w.Apps["consumer"]; src.Mode != protocol.ModePrimary || src.PendingRestore {
		t.Fatalf("source not serving: %+v", src)
	}
	if len(w.Archives) != 0 || w.Queues["work.ms2m-replay"] || w.Queues["work.ms2m-migration"] {
		t.Fatalf("left behind: archives %v queues %v", w.Archives, w.Queues)
	}
}

// TestDryRunPredicts: λ is counted on a probe queue (the fake's depth is
// always 7 over the 3 s window), μ and the critical path come from an
// earlier migration of the same queue, and replay ≈ backlog / (μ − λ).
func TestDryRunPredicts(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	earlier := &report.Record{ID: "early", Strategy: "ms2m", Namespace: "default", Pod: "consumer", Outcome: report.Succeeded,
		Broker: report.Broker{ReplayQueue: "work.ms2m-replay", Replayed: 40},
		Phases: []report.PhaseTiming{
			{Name: report.Prepare, StartMillis: 900, DurationMillis: 100},
			{Name: report.Checkpoint, StartMillis: 1000, DurationMillis: 300},
			{Name: report.Restore, StartMillis: 1400, DurationMillis: 1000},
			{Name: report.Replay, StartMillis: 2400, DurationMillis: 2000},
		}}
	if err := (report.Store{Client: w.Client}).Save(context.Background(), earlier); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(migrate.MS2M)
	cfg.DryRun = true
	rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	p := rec.Prediction
	if p == nil || p.LambdaWindowMillis < 3000 {
		t.Fatalf("prediction %+v: λ counted for less than the dry run's 3 s", p)
	}
	lambda := 7.0 / (float64(p.LambdaWindowMillis) / 1000)
	wantReplay := lambda * 1.5 / (20 - lambda) * 1000 // ms
	if p.FromRuns != 1 || p.Mu != 20 || p.MuFrom != report.MuFromHistory || p.CriticalPathMillis != 1400 || math.Abs(p.Lambda-lambda) > 0.01 ||
		math.Abs(float64(p.ReplayMillis)-wantReplay) > 2 || p.DowntimeMillis != 50 || len(p.Warnings) != 0 {
		t.Fatalf("prediction %+v, want replay ≈ %.0f ms", p, wantReplay)
	}
	if w.Queues["work.ms2m-probe-"+cfg.ID] {
		t.Fatal("the probe queue is left")
	}

	// Without history, and an application that does not say its service
	// time, μ is unknown, and said so.
	w2 := migratetest.NewWorld(t)
	rec, err = migrate.Run(context.Background(), cfg, w2.Deps(), migrate.Hooks{})
	if err != nil || rec.Prediction == nil || rec.Prediction.Mu != 0 || len(rec.Prediction.Warnings) != 1 || !strings.Contains(rec.Prediction.Warnings[0], "μ") {
		t.Fatalf("without history: %v %+v", err, rec.Prediction)
	}
}

// TestMigrationKeepsItsPrediction: a migration predicts itself as its
// preflight ends, from λ counted during preflight and, with no earlier
// migration of the queue, μ from the application's service time; the record
// keeps the prediction beside what happened, and the probe queue is gone.
func TestMigrationKeepsItsPrediction(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	w.Apps["consumer"].ServiceMillis = 50
	var said []string
	cfg := testConfig(migrate.MS2M)
	cfg.PredictWindow = 0 // the default
	rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{Progress: func(_ report.PhaseName, msg string) { said = append(said, msg) }})
	if err != nil {
		t.Fatal(err)
	}
	p := rec.Prediction
	if p == nil || p.Mu != 20 || p.MuFrom != report.MuFromApplication || p.Lambda <= 0 || p.LambdaWindowMillis <= 0 || p.TotalMillis <= 0 || p.FromRuns != 0 {
		t.Fatalf("prediction %+v", p)
	}
	if !slices.ContainsFunc(said, func(s string) bool { return strings.HasPrefix(s, "expected: total ≈ ") }) {
		t.Fatalf("the prediction was not said: %q", said)
	}
	if w.Queues["work.ms2m-probe-"+cfg.ID] {
		t.Fatal("the probe queue is left")
	}
	stored, err := report.Store{Client: w.Client}.Get(context.Background(), "default", rec.ID)
	if err != nil || stored.Prediction == nil || stored.Prediction.TotalMillis != p.TotalMillis || stored.TotalMillis == 0 {
		t.Fatalf("stored record %+v: %v", stored, err)
	}
}

// TestReplayWaitsForASourceThatRestarts: the source's endpoint does not
// answer for a while during replay (its process died and restarts); replay
// asks again instead of failing, and the migration completes.
func TestReplayWaitsForASourceThatRestarts(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	hooks := migrate.Hooks{Progress: func(_ report.PhaseName, msg string) {
		if strings.HasPrefix(msg, "replaying ") {
			w.Mu.Lock()
			w.Unanswered["consumer"] = 3
			w.Mu.Unlock()
		}
	}}
	rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), hooks)
	if err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("outcome %s: %v", rec.Outcome, err)
	}
	if n := w.Unanswered["consumer"]; n > 0 {
		t.Fatalf("replay never asked the source again (%d reads left unanswered)", n)
	}
}

// TestARestoredCopyIsAskedAgainWhileAnAskStalls: the first asks of the
// restored copy hang (opened while CRIU restored it, their SYN dropped);
// the engine asks again meanwhile and goes on with the first answer, on
// either restore path: the stalled asks are cancelled when the copy has
// answered, not waited out to their deadline.
func TestARestoredCopyIsAskedAgainWhileAnAskStalls(t *testing.T) {
	t.Parallel()
	for _, path := range restorePaths {
		t.Run(path.name, func(t *testing.T) {
			w := path.world(newWorld)(t)
			w.Mu.Lock()
			w.Stalled["consumer-abcde"] = 2
			w.Mu.Unlock()
			rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
			if err != nil || rec.Outcome != report.Succeeded {
				t.Fatalf("outcome %s: %v", rec.Outcome, err)
			}
			var ends []error
			if err := wait(func() bool {
				w.Mu.Lock()
				defer w.Mu.Unlock()
				ends = slices.Clone(w.StallEnds)
				return len(ends) == 2
			}); err != nil {
				t.Fatalf("the stalled asks never ended: %v", ends)
			}
			for _, end := range ends {
				if !errors.Is(end, context.Canceled) {
					t.Fatalf("a stalled ask was waited out (%v) rather than asked past", end)
				}
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTargetKubeletGone: the target node's kubelet goes away, for good, as
// the restore starts (it never starts the pod) or during replay (it never
// confirms the restored copy's deletion). The migration rolls back within
// the kubelet timeout, not the phase's: the copy is stopped through the
// node's runtime and its pod deleted at once, and the source serves.
func TestTargetKubeletGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		when    report.PhaseName
		copyRan bool
	}{{report.Restore, false}, {report.Replay, true}} {
		t.Run(string(tc.when), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			if tc.when == report.Replay {
				w.FailAt = report.Replay
			}
			cfg := testConfig(migrate.MS2M)
			cfg.KubeletTimeout, cfg.PhaseTimeout, cfg.ReplayTimeout = 300*time.Millisecond, time.Minute, 500*time.Millisecond
			hooks := migrate.Hooks{PhaseStarted: func(p report.PhaseTiming) {
				if p.Name == tc.when {
					w.Mu.Lock()
					w.KubeletDown = map[string]bool{"node-b": true}
					w.Mu.Unlock()
				}
			}}
			rec, err := migrate.Run(context.Background(), cfg, w.Deps(), hooks)
			if err == nil || rec.Outcome != report.RolledBack {
				t.Fatalf("outcome %s: %v", rec.Outcome, err)
			}
			if tc.when == report.Restore && !strings.Contains(err.Error(), "cannot start on node-b") {
				t.Fatalf("the error does not say why the restore failed: %v", err)
			}
			if p, _ := rec.Phase(tc.when); time.Duration(p.DurationMillis)*time.Millisecond > 10*time.Second {
				t.Fatalf("%s took %dms: it waited for its timeout, not the kubelet's", tc.when, p.DurationMillis)
			}
			if _, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("target pod left behind: %v", err)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
			w.Mu.Lock()
			defer w.Mu.Unlock()
			stopped := slices.Contains(w.Calls, "stop pod consumer-abcde on node-b through the runtime")
			if _, running := w.Apps["consumer-abcde"]; running || !stopped {
				t.Fatalf("the copy still runs (%t) or was never stopped through the runtime (%t): %v", running, !stopped, w.Calls)
			}
			if _, ran := rec.Phase(report.Replay); ran != tc.copyRan {
				t.Fatalf("replay ran: %t, want %t", ran, tc.copyRan)
			}
			if src := w.Apps["consumer"]; src.Mode != protocol.ModePrimary || src.PendingRestore {
				t.Fatalf("source not serving after rollback: %+v", src)
			}
			if w.Queues["work.ms2m-replay"] || w.Queues["work.ms2m-migration"] || len(w.Archives) > 0 || len(w.Images) > 0 {
				t.Fatalf("left behind: queues %v archives %v images %v", w.Queues, w.Archives, w.Images)
			}
		})
	}
}

// TestUnwritableRecordLeavesNoLock: a caller who may create but not update
// ConfigMaps gets a migration that rolls back at its first journal update,
// and the pod's lock goes with it, so the next migration is not refused.
func TestUnwritableRecordLeavesNoLock(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	w.Client.PrependReactor("update", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "kubectl-migrate-abcde", errors.New("RBAC: update not allowed"))
	})
	rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "forbidden") || rec.Outcome != report.RolledBack {
		t.Fatalf("got %v (%s)", err, rec.Outcome)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
	if leases := w.Leases(); len(leases) != 0 {
		t.Fatalf("leases left: %v", leases)
	}
}

// TestRollbackLeavesAPodItDidNotCreate: a pod that took the target's name
// between preflight and restore is someone else's; the failed restore rolls
// back without deleting it.
func TestRollbackLeavesAPodItDidNotCreate(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	hooks := migrate.Hooks{PhaseStarted: func(p report.PhaseTiming) {
		if p.Name == report.Restore {
			other := migratetest.SourcePod()
			other.Name, other.Labels = "consumer-abcde", map[string]string{"app": "someone-else"}
			if _, err := w.Client.CoreV1().Pods("default").Create(context.Background(), other, metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}
	}}
	rec, err := migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), hooks)
	if err == nil || !strings.Contains(err.Error(), "already exists") || rec.Outcome != report.RolledBack {
		t.Fatalf("got %v (%s)", err, rec.Outcome)
	}
	pod, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "consumer-abcde", metav1.GetOptions{})
	if err != nil || pod.Labels["app"] != "someone-else" {
		t.Fatalf("the other pod was deleted or replaced: %v", err)
	}
}

// TestRuntimeRestore: a target whose runtime does not restore (containerd
// 2.4) is refused in preflight naming node-setup, with nothing changed;
// once labelled as set up, the migration picks the kubectl-migrate runtime
// by itself: the checkpoint is sent to the target's agent and staged there,
// the target runs its own image under the RuntimeClass and is restored from
// the staged checkpoint, and no image or registry is involved. A failure
// after the staging removes the staged checkpoint.
func TestRuntimeRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	setTarget := func(w *migratetest.World, installed bool) {
		node, err := w.Client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.4.2"
		if installed {
			node.Labels = map[string]string{ociruntime.NodeLabel: "installed"}
		}
		if _, err := w.Client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w := migratetest.NewWorld(t)
	setTarget(w, false)
	_, err := migrate.Run(ctx, testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "kubectl migrate node-setup node-b") {
		t.Fatalf("want a refusal naming node-setup, got %v", err)
	}
	if src := w.Apps["consumer"]; src.Mode != protocol.ModePrimary || len(w.Archives) != 0 {
		t.Fatalf("something changed: %+v %v", src, w.Archives)
	}

	for _, strategy := range []migrate.Strategy{migrate.MS2M, migrate.StopAndCopy} {
		t.Run(string(strategy), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			setTarget(w, true)
			rec, err := migrate.Run(ctx, testConfig(strategy), w.Deps(), migrate.Hooks{})
			if err != nil || rec.Outcome != report.Succeeded {
				t.Fatalf("%v %s", err, rec.Outcome)
			}
			calls := strings.Join(w.Calls, "\n")
			for _, want := range []string{"send to 192.0.2.98:8093", "stage /var/lib/kubectl-migrate/restore/default/consumer-abcde/app"} {
				if !strings.Contains(calls, want) {
					t.Errorf("no %q in:\n%s", want, calls)
				}
			}
			if strings.Contains(calls, "push") || strings.Contains(calls, "delete image") || len(rec.Images) != 0 {
				t.Errorf("an image was made or deleted: %v\n%s", rec.Images, calls)
			}
			target, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{})
			if err != nil || target.Spec.RuntimeClassName == nil || *target.Spec.RuntimeClassName != ociruntime.HandlerName || strings.Contains(target.Spec.Containers[0].Image, "8091") {
				t.Fatalf("target %+v: %v", target.Spec, err)
			}
			if len(w.Staged) != 0 || len(w.Expected) != 0 {
				t.Fatalf("left staged: %v %v", w.Staged, w.Expected)
			}
			// The target pod was created, its checkpoint expected, before
			// the source was checkpointed: in the first phase that changes
			// anything.
			expect, checkpointed := strings.Index(calls, "expect /var/lib/kubectl-migrate/restore/default/consumer-abcde/app.expected on node-b"), strings.Index(calls, "checkpoint default/consumer/app")
			created := func(p report.PhaseName) bool {
				ph, _ := rec.Phase(p)
				return slices.ContainsFunc(ph.Steps, func(s report.Step) bool { return s.Name == report.PodCreate })
			}
			first := map[migrate.Strategy]report.PhaseName{migrate.MS2M: report.Prepare, migrate.StopAndCopy: report.Stop}[strategy]
			if expect < 0 || checkpointed < expect || !created(first) || created(report.Restore) {
				t.Fatalf("expected at %d, checkpointed at %d; created in %s: %t\n%s", expect, checkpointed, first, created(first), calls)
			}
			// Its address was reported before the checkpoint: an init
			// container (the agent's noop) ends the kubelet's first sync.
			ph, _ := rec.Phase(first)
			if !slices.ContainsFunc(ph.Steps, func(s report.Step) bool { return s.Name == report.PodAddressed }) {
				t.Fatalf("no %q step in %s: %+v", report.PodAddressed, first, ph.Steps)
			}
			if inits := target.Spec.InitContainers; len(inits) != 1 || inits[0].Name != migrate.AddressInitContainer || inits[0].Image != testConfig(strategy).AgentImage || !slices.Equal(inits[0].Args, []string{"noop"}) {
				t.Fatalf("target's init containers: %+v", inits)
			}
		})
	}

	// The early target's address init container cannot be pulled: the
	// migration says so, naming --agent-image, before the checkpoint, and
	// rolls back.
	t.Run("rollback/address", func(t *testing.T) {
		w := migratetest.NewWorld(t)
		setTarget(w, true)
		w.InitWaiting = "ErrImagePull"
		rec, err := migrate.Run(ctx, testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
		if err == nil || rec.Outcome != report.RolledBack || !strings.Contains(err.Error(), "--agent-image") {
			t.Fatalf("%v %s", err, rec.Outcome)
		}
		if strings.Contains(strings.Join(w.Calls, "\n"), "checkpoint default/consumer/app") {
			t.Fatalf("checkpointed although the target could not start:\n%s", strings.Join(w.Calls, "\n"))
		}
		if _, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the target is left: %v", err)
		}
		if len(w.Staged) != 0 || len(w.Expected) != 0 {
			t.Fatalf("left staged: %v %v", w.Staged, w.Expected)
		}
		if err := w.Conservation(); err != nil {
			t.Fatal(err)
		}
	})

	// Failed before its checkpoint was staged, the target created early
	// goes, and then its mark: the source serves on.
	for _, failed := range []report.PhaseName{report.Checkpoint, report.Image} {
		t.Run("rollback/"+string(failed), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			setTarget(w, true)
			w.FailAt = failed
			rec, err := migrate.Run(ctx, testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
			if err == nil || rec.Outcome != report.RolledBack {
				t.Fatalf("%v %s", err, rec.Outcome)
			}
			if _, err := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("the target is left: %v", err)
			}
			if len(w.Staged) != 0 || len(w.Expected) != 0 {
				t.Fatalf("left staged: %v %v", w.Staged, w.Expected)
			}
			if src := w.Apps["consumer"]; src.Mode != protocol.ModePrimary || src.PendingRestore {
				t.Fatalf("source not serving: %+v", src)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}

	t.Run("rollback", func(t *testing.T) {
		w := migratetest.NewWorld(t)
		setTarget(w, true)
		w.FailAt = report.Restore
		rec, err := migrate.Run(ctx, testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
		if err == nil || rec.Outcome != report.RolledBack {
			t.Fatalf("%v %s", err, rec.Outcome)
		}
		if len(w.Staged) != 0 || !strings.Contains(strings.Join(w.Calls, "\n"), "remove [/var/lib/kubectl-migrate/restore/default/consumer-abcde/app] on node-b") {
			t.Fatalf("the staged checkpoint was not removed: %v\n%s", w.Staged, strings.Join(w.Calls, "\n"))
		}
		if src := w.Apps["consumer"]; src.Mode != protocol.ModePrimary || src.PendingRestore {
			t.Fatalf("source not serving: %+v", src)
		}
	})
}

// TestReceiversTakeTurns: another migration's agent receives on node-b's
// ports, so a migration without a registry onto node-b waits, saying for
// whom, and goes on once that agent is gone.
func TestReceiversTakeTurns(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	cfg := testConfig(migrate.MS2M)
	cfg.Transfer, cfg.ImageRepository = migrate.Direct, ""
	waitForAnotherReceiver(t, w, cfg, "node-b", func() {})
}

// TestReceiversOnBothNodesStartInNodeOrder: a StatefulSet pod's move
// without a registry receives on both nodes, and takes their ports in the
// order of the nodes' names. With node-a's held by another migration, it
// waits for them holding none of node-b's: two such moves side by side
// (the lab's containerd 2.4 lane ran two) otherwise each held one node's
// ports and waited for the other's until the phase's time limit.
func TestReceiversOnBothNodesStartInNodeOrder(t *testing.T) {
	t.Parallel()
	w := migratetest.NewStatefulSetWorld(t)
	runtimeOnly(t, w, "node-a", "node-b") // restored through the runtime, the only way without a registry
	cfg := stsConfig(migrate.MS2M, migrate.Sequential)
	cfg.Transfer, cfg.ImageRepository, cfg.Restore = migrate.Direct, "", migrate.RestoreRuntime
	cfg.PhaseTimeout = 30 * time.Second // the wait below is this test's, not the migration's
	waitForAnotherReceiver(t, w, cfg, "node-a", func() {
		pods, err := w.Client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Error(err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == "node-b" && p.Labels[migrate.MigrationLabel] == cfg.ID && slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool {
				return slices.ContainsFunc(c.Ports, func(port corev1.ContainerPort) bool { return port.HostPort == agent.DirectReceivePort })
			}) {
				t.Errorf("waiting for node-a's receive ports, the migration holds node-b's (%s)", p.Name)
			}
		}
	})
}

// waitForAnotherReceiver runs the migration cfg while another migration's
// agent receives on node's ports: the migration must wait, saying for whom
// (then whileWaiting runs), and go on once that agent is gone, conserving
// every message.
func waitForAnotherReceiver(t *testing.T, w *migratetest.World, cfg migrate.Config, node string, whileWaiting func()) {
	t.Helper()
	ctx := context.Background()
	other := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kubectl-migrate-agent-other", Namespace: "default", Labels: map[string]string{migrate.MigrationLabel: "other"}},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: true, Containers: []corev1.Container{{
			Name: "agent", Ports: []corev1.ContainerPort{{ContainerPort: agent.DirectReceivePort, HostPort: agent.DirectReceivePort}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if _, err := w.Client.CoreV1().Pods("default").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var once sync.Once
	hooks := migrate.Hooks{Progress: func(_ report.PhaseName, msg string) {
		if strings.Contains(msg, "kubectl-migrate-agent-other of another migration receives on "+node+"'s ports") {
			once.Do(func() { close(waiting) })
		}
	}}
	done := make(chan error, 1)
	go func() {
		_, err := migrate.Run(ctx, cfg, w.Deps(), hooks)
		done <- err
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("the migration did not wait for the other receiver: %v", err)
	}
	whileWaiting()
	if err := w.Client.CoreV1().Pods("default").Delete(ctx, other.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
}

// TestAReceiverTriesAgainWhenAnEndedOneHeldItsPort: a receiver that ends
// because the node's receive port is held, though no receiver's pod runs
// any more (one whose process was still ending), is started again, a few
// times: the migration goes on; one held for good fails it, rolled back.
func TestAReceiverTriesAgainWhenAnEndedOneHeldItsPort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		held     int
		outcome  report.Outcome
		attempts int
	}{{held: 2, outcome: report.Succeeded, attempts: 3}, {held: 100, outcome: report.RolledBack, attempts: 6}} {
		t.Run(fmt.Sprint(tc.held), func(t *testing.T) {
			t.Parallel()
			w := migratetest.NewWorld(t)
			w.PortHeldByTheGone = tc.held
			cfg := testConfig(migrate.MS2M)
			cfg.Transfer, cfg.ImageRepository = migrate.Direct, ""
			rec, err := migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{})
			if rec.Outcome != tc.outcome {
				t.Fatalf("%s: %v", rec.Outcome, err)
			}
			// Held for good: tried again, but no more than a few times
			// (and not beyond the phase's time limit).
			n := strings.Count(strings.Join(w.Calls, "\n"), "on node-b (direct true)")
			if tc.outcome == report.Succeeded && n != tc.attempts || n < 2 || n > tc.attempts {
				t.Fatalf("%d receivers started on node-b, want %d", n, tc.attempts)
			}
			if err := w.Conservation(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAnAnonymousCheckpointPullIsNamed: preflight says when the target will
// pull the checkpoint image without credentials (any pod on the node could
// then run it), and not when a registry secret or a direct transfer gives
// it credentials.
func TestAnAnonymousCheckpointPullIsNamed(t *testing.T) {
	t.Parallel()
	anonymous := testConfig(migrate.MS2M)
	withSecret := testConfig(migrate.MS2M)
	withSecret.RegistrySecret = "regcred"
	direct := testConfig(migrate.MS2M)
	direct.Transfer, direct.ImageRepository = migrate.Direct, ""
	for name, c := range map[string]struct {
		cfg  migrate.Config
		warn bool
	}{"anonymous": {anonymous, true}, "registry secret": {withSecret, false}, "direct": {direct, false}} {
		t.Run(name, func(t *testing.T) {
			w := migratetest.NewWorld(t)
			secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: "default"}, Type: corev1.SecretTypeDockerConfigJson,
				Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"registry:5000":{"auth":"dTpw"}}}`)}}
			if _, err := w.Client.CoreV1().Secrets("default").Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			warned := false
			hooks := migrate.Hooks{Progress: func(_ report.PhaseName, msg string) {
				warned = warned || strings.Contains(msg, "pulled without credentials")
			}}
			if _, err := migrate.Run(context.Background(), c.cfg, w.Deps(), hooks); err != nil {
				t.Fatal(err)
			}
			if warned != c.warn {
				t.Fatalf("warned %t, want %t", warned, c.warn)
			}
		})
	}
}
