package migrate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// crashHooks end the migration's goroutine, as a SIGKILL would end the
// process, at its nth step after setup: a step is a phase starting (the
// journal names it by then) or a phase reporting progress (after a change
// inside it, such as a pod created or a StatefulSet deleted). With n = 0
// they only count the steps. Preflight and setup journal nothing: a crash
// in them leaves nothing to recover (TestACrashInSetupLeavesNothingToRecover).
func crashHooks(n int, steps *int) migrate.Hooks {
	counting := false
	step := func() {
		if !counting {
			return
		}
		if *steps++; *steps == n {
			runtime.Goexit()
		}
	}
	return migrate.Hooks{
		PhaseStarted: func(p report.PhaseTiming) {
			counting = counting || p.Name != report.Preflight && p.Name != report.Setup
			step()
		},
		Progress: func(report.PhaseName, string) { step() },
	}
}

// crashSteps counts the steps a migration of cfg takes in a fresh world.
func crashSteps(t *testing.T, world func(*testing.T) *migratetest.World, cfg migrate.Config) int {
	steps := 0
	if _, err := migrate.Run(context.Background(), cfg, world(t).Deps(), crashHooks(0, &steps)); err != nil {
		t.Fatal(err)
	}
	return steps
}

// crashAt runs the migration and kills it at step n; it returns the record
// the cluster keeps.
func crashAt(t *testing.T, w *migratetest.World, cfg migrate.Config, n int) *report.Record {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		steps := 0
		_, _ = migrate.Run(context.Background(), cfg, w.Deps(), crashHooks(n, &steps))
	}()
	<-done
	w.ExpireLeases() // the process is long dead
	records := w.Records()
	if len(records) != 1 {
		t.Fatalf("want the record of the crashed migration, have %d", len(records))
	}
	if rec := records[0]; rec.Outcome != report.Running || len(rec.Journal) == 0 {
		t.Fatalf("the crashed migration's record is %s with a %d-byte journal, before step %d: %s", rec.Outcome, len(rec.Journal), n, rec.Error)
	}
	return records[0]
}

func newWorld(t *testing.T) *migratetest.World { return migratetest.NewWorld(t) }

// crashAndRecover crashes cfg's migration in w at step n, recovers it, and
// checks that no message was lost or applied twice; it returns the phase
// it crashed in and the recovered record.
func crashAndRecover(t *testing.T, w *migratetest.World, cfg migrate.Config, n int) (report.PhaseTiming, *report.Record) {
	t.Helper()
	crashed := crashAt(t, w, cfg, n)
	last := crashed.Phases[len(crashed.Phases)-1]
	rec := recoverTwice(t, w, crashed)
	if err := w.Conservation(); err != nil {
		t.Fatalf("crashed in %s, recovered to %s: %v", last.Name, rec.Outcome, err)
	}
	return last, rec
}

// recoverTwice recovers rec, then recovers again, which must find nothing.
func recoverTwice(t *testing.T, w *migratetest.World, rec *report.Record) *report.Record {
	t.Helper()
	got, err := migrate.Recover(context.Background(), rec, "amqp://x", w.Deps(), migrate.Hooks{})
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	if !got.Outcome.Final() || len(w.Records()[0].Journal) != 0 {
		t.Fatalf("recovered to %s, journal kept: %v", got.Outcome, len(w.Records()[0].Journal) != 0)
	}
	if leases := w.Leases(); len(leases) != 0 {
		t.Fatalf("leases left: %v", leases)
	}
	if _, err := migrate.Recover(context.Background(), w.Records()[0], "amqp://x", w.Deps(), migrate.Hooks{}); !errors.Is(err, migrate.ErrNothingToRecover) {
		t.Fatalf("a second recovery: %v", err)
	}
	return got
}

// restorePaths are the worlds the crash matrices run in: nodes whose
// container runtime restores, and nodes where only the kubectl-migrate
// runtime does (the checkpoints staged, not imaged).
var restorePaths = []struct {
	name  string
	world func(func(*testing.T) *migratetest.World) func(*testing.T) *migratetest.World
}{
	{"cri", func(world func(*testing.T) *migratetest.World) func(*testing.T) *migratetest.World { return world }},
	{"runtime", func(world func(*testing.T) *migratetest.World) func(*testing.T) *migratetest.World {
		return func(t *testing.T) *migratetest.World {
			w := world(t)
			runtimeOnly(t, w, "node-a", "node-b")
			return w
		}
	}},
}

// TestRecoverFromACrashAtEveryStep kills the migration at each step after
// preflight and recovers it, on either restore path: before the commit
// point the source serves again with nothing left behind; after it the
// target serves.
func TestRecoverFromACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	for _, path := range restorePaths {
		for _, strategy := range migrate.Strategies {
			world, cfg := path.world(newWorld), testConfig(strategy)
			if !strategy.Contract() {
				world = path.world(func(t *testing.T) *migratetest.World { w, _ := contractless(t); return w })
				_, cfg = contractless(t)
			}
			steps := crashSteps(t, world, cfg)
			for n := 1; n <= steps; n++ {
				t.Run(fmt.Sprintf("%s/%s/%d", path.name, strategy, n), func(t *testing.T) {
					t.Parallel()
					recoverPodAt(t, world(t), cfg, n)
				})
			}
		}
	}
}

// recoverPodAt crashes a bare pod's migration in w at step n, recovers
// it, and checks the pod serves where the commit point says, nothing left.
func recoverPodAt(t *testing.T, w *migratetest.World, cfg migrate.Config, n int) {
	t.Helper()
	last, rec := crashAndRecover(t, w, cfg, n)
	ctx := context.Background()
	_, srcErr := w.Client.CoreV1().Pods("default").Get(ctx, "consumer", metav1.GetOptions{})
	_, tgtErr := w.Client.CoreV1().Pods("default").Get(ctx, "consumer-abcde", metav1.GetOptions{})
	leftRequests := w.AgentRequests()
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if rec.Outcome == report.Succeeded {
		if !apierrors.IsNotFound(srcErr) || tgtErr != nil || w.Apps["consumer-abcde"].Mode != protocol.ModePrimary {
			t.Fatalf("crashed in %s, completed, but source %v, target %v", last.Name, srcErr, tgtErr)
		}
	} else {
		if srcErr != nil || !apierrors.IsNotFound(tgtErr) {
			t.Fatalf("crashed in %s, rolled back, but source %v, target %v", last.Name, srcErr, tgtErr)
		}
		if src := w.Apps["consumer"]; src.Mode != protocol.ModePrimary || src.PendingRestore || w.Isolated["consumer"] {
			t.Fatalf("source not serving after recovery: %+v (cut off the network: %t)", src, w.Isolated["consumer"])
		}
	}
	// Only a crash past the commit point completes.
	if committed := last.Name == report.Cleanup || last.Name == report.Switchover && rec.Outcome == report.Succeeded; committed != (rec.Outcome == report.Succeeded) {
		t.Fatalf("crashed in %s, recovered to %s", last.Name, rec.Outcome)
	}
	if w.Queues["work.ms2m-replay"] || w.Queues["work.ms2m-migration"] || len(w.Archives) > 0 || (rec.Outcome == report.RolledBack && len(w.Images) > 0) || len(w.Staged) > 0 {
		t.Fatalf("left behind: queues %v archives %v images %v staged %v", w.Queues, w.Archives, w.Images, w.Staged)
	}
	if len(leftRequests) > 0 {
		t.Fatalf("crashed in %s, recovered to %s, left agent requests %v", last.Name, rec.Outcome, leftRequests)
	}
}

// TestRecoverStatefulSetFromACrashAtEveryStep does the same for a
// StatefulSet pod in every mode: the StatefulSet is never left deleted.
func TestRecoverStatefulSetFromACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		strategy migrate.Strategy
		mode     migrate.StatefulSetMode
	}{{migrate.MS2M, migrate.Sequential}, {migrate.StopAndCopy, migrate.Sequential}, {migrate.CheckpointRestore, migrate.Sequential}, {migrate.MS2M, migrate.Shadow}} {
		for _, path := range restorePaths {
			world := path.world(func(t *testing.T) *migratetest.World { w, _ := stsWorld(t, tc.strategy, tc.mode); return w })
			steps := crashSteps(t, world, crashStatefulSetConfig(tc.strategy, tc.mode))
			for n := 1; n <= steps; n++ {
				t.Run(fmt.Sprintf("%s/%s/%s/%d", path.name, tc.strategy, tc.mode, n), func(t *testing.T) {
					t.Parallel()
					recoverStatefulSetAt(t, world(t), tc.strategy, tc.mode, n)
				})
			}
		}
	}
}

// crashStatefulSetConfig is stsConfig with timeouts no loaded machine
// reaches: the matrix counts a migration's steps once and replays them,
// so a run that times out and rolls back early (seen under -race on two
// busy CPUs) would never reach the step it is to crash at.
func crashStatefulSetConfig(strategy migrate.Strategy, mode migrate.StatefulSetMode) migrate.Config {
	cfg := stsConfig(strategy, mode)
	cfg.ReplayTimeout, cfg.PhaseTimeout = 10*time.Second, 10*time.Second
	return cfg
}

// recoverStatefulSetAt crashes a StatefulSet pod's migration in w at step
// n and recovers it: the StatefulSet serves on the node the commit point
// says, never left deleted.
func recoverStatefulSetAt(t *testing.T, w *migratetest.World, strategy migrate.Strategy, mode migrate.StatefulSetMode, n int) {
	t.Helper()
	other := consumer1(t, w)
	last, rec := crashAndRecover(t, w, crashStatefulSetConfig(strategy, mode), n)
	node := "node-a"
	if rec.Outcome == report.Succeeded {
		node = "node-b"
	}
	checkStatefulSet(t, w, node, other)
	leftRequests := w.AgentRequests()
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if len(w.Staged) > 0 {
		t.Fatalf("crashed in %s, recovered to %s, left staged %v", last.Name, rec.Outcome, w.Staged)
	}
	if len(leftRequests) > 0 {
		t.Fatalf("crashed in %s, recovered to %s, left agent requests %v", last.Name, rec.Outcome, leftRequests)
	}
}

// TestACrashAsACheckpointIsStagedLeavesNoCopy kills the migration as the
// target's agent stages a checkpoint for the kubectl-migrate runtime,
// before the journal names it: the recovery removes it all the same (it is
// the application's memory), and no message is lost or applied twice.
func TestACrashAsACheckpointIsStagedLeavesNoCopy(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		world func(*testing.T) *migratetest.World
		cfg   migrate.Config
	}{
		{"pod/ms2m", newWorld, testConfig(migrate.MS2M)},
		{"pod/stop-and-copy", newWorld, testConfig(migrate.StopAndCopy)},
		{"sts/sequential", migratetest.NewStatefulSetWorld, stsConfig(migrate.MS2M, migrate.Sequential)},
		{"sts/shadow", migratetest.NewStatefulSetWorld, stsConfig(migrate.MS2M, migrate.Shadow)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			w := tc.world(t)
			runtimeOnly(t, w, "node-a", "node-b")
			w.DieAfterStaging = true
			crashed := crashAt(t, w, tc.cfg, 0) // no hook ends it: the staging does
			w.Mu.Lock()
			died := !w.DieAfterStaging
			w.Mu.Unlock()
			if !died {
				t.Fatal("the migration did not die staging a checkpoint")
			}
			rec := recoverTwice(t, w, crashed)
			if err := w.Conservation(); err != nil {
				t.Fatalf("recovered to %s: %v", rec.Outcome, err)
			}
			w.Mu.Lock()
			defer w.Mu.Unlock()
			if len(w.Staged) > 0 || len(w.Expected) > 0 {
				t.Fatalf("recovered to %s, left staged %v, marks %v", rec.Outcome, w.Staged, w.Expected)
			}
		})
	}
}

func TestSecondMigrationRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		world func(*testing.T) *migratetest.World
		first migrate.Config
		again func() migrate.Config
		want  string
	}{
		{"same pod", func(t *testing.T) *migratetest.World { return migratetest.NewWorld(t) }, testConfig(migrate.MS2M), func() migrate.Config {
			c := testConfig(migrate.StopAndCopy)
			c.ID, c.TargetName = "fghij", "consumer-fghij"
			return c
		}, "pod consumer is being migrated by migration abcde"},
		{"other ordinal", migratetest.NewStatefulSetWorld, stsConfig(migrate.MS2M, migrate.Sequential), func() migrate.Config {
			c := stsConfig(migrate.MS2M, migrate.Sequential)
			c.ID, c.Pod, c.TargetName = "fghij", "consumer-1", "consumer-1"
			return c
		}, "StatefulSet consumer is being migrated by migration abcde"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.world(t)
			var second error
			hooks := migrate.Hooks{PhaseStarted: func(p report.PhaseTiming) {
				if p.Name == report.Checkpoint {
					before := len(w.Changes())
					_, second = migrate.Run(context.Background(), tc.again(), w.Deps(), migrate.Hooks{})
					if after := w.Changes(); len(after) != before {
						t.Errorf("the refused migration did %v", after[before:])
					}
				}
			}}
			if _, err := migrate.Run(context.Background(), tc.first, w.Deps(), hooks); err != nil {
				t.Fatal(err)
			}
			if second == nil || !strings.Contains(second.Error(), tc.want) {
				t.Fatalf("second migration: %v, want %q", second, tc.want)
			}
		})
	}
}

// TestCrashedMigrationPointsAtRecovery: the leases of a dead migration are
// not taken over by the next one, which names the recovery command.
func TestCrashedMigrationPointsAtRecovery(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	crashAt(t, w, testConfig(migrate.MS2M), 3)
	again := testConfig(migrate.MS2M)
	again.ID, again.TargetName = "fghij", "consumer-fghij"
	_, err := migrate.Run(context.Background(), again, w.Deps(), migrate.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "kubectl migrate recover abcde -n default") {
		t.Fatalf("got %v", err)
	}
}

// TestRecoverRemovesAnArchiveItNeverLearnt: the process dies while the
// kubelet writes the archive, before it answers with its path; recovery
// still removes it (it holds the process's memory).
func TestRecoverRemovesAnArchiveItNeverLearnt(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	w.AfterCheckpoint = runtime.Goexit
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{})
	}()
	<-done
	w.AfterCheckpoint = nil
	w.ExpireLeases()
	if len(w.Archives) != 1 {
		t.Fatalf("the kubelet wrote %d archives", len(w.Archives))
	}
	if rec := recoverTwice(t, w, w.Records()[0]); rec.Outcome != report.RolledBack {
		t.Fatalf("recovered to %s", rec.Outcome)
	}
	if len(w.Archives) != 0 {
		t.Fatalf("archives left: %v", w.Archives)
	}
}

// TestRecoveryMovesBackACopyThatConsumed: a StatefulSet pod's restored copy
// that consumed its primary queue before the commit point (whatever told it
// to) holds messages nothing else has; recovery moves its state back into
// the source's place instead of deleting it.
func TestRecoveryMovesBackACopyThatConsumed(t *testing.T) {
	t.Parallel()
	w := migratetest.NewStatefulSetWorld(t)
	other := consumer1(t, w)
	cfg := stsConfig(migrate.StopAndCopy, migrate.Sequential)
	hooks := migrate.Hooks{PhaseStarted: func(p report.PhaseTiming) {
		if p.Name == report.Switchover {
			target := appctl.Target{Namespace: "default", Pod: "consumer-0", Port: cfg.ControlPort, Token: migratetest.ControlToken}
			if _, err := w.Deps().App.Control(context.Background(), target, protocol.Control{Type: protocol.Resume}); err != nil {
				t.Error(err)
			}
			runtime.Goexit()
		}
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = migrate.Run(context.Background(), cfg, w.Deps(), hooks)
	}()
	<-done
	w.ExpireLeases()
	rec := recoverTwice(t, w, w.Records()[0])
	if rec.Outcome != report.RolledBack {
		t.Fatalf("recovered to %s", rec.Outcome)
	}
	checkStatefulSet(t, w, "node-a", other) // conservation included
}

// TestJournalKeepsNoSecrets: a journal (readable by whoever reads ConfigMaps
// in the namespace) holds neither the direct transfer's push token nor the
// broker's password, nor the saved pod's managed fields and kubectl's
// last-applied copy — and recovery from it still ends the migration.
func TestJournalKeepsNoSecrets(t *testing.T) {
	t.Parallel()
	source := migratetest.SourcePod()
	source.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	if source.Annotations == nil {
		source.Annotations = map[string]string{}
	}
	source.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = `{"kind":"Pod","env":"SECRET=hunter2"}`
	source.Annotations[migrate.BrokerURLAnnotation] = "amqp://app:s3cret-pass@broker:5672/"
	world := func(t *testing.T) *migratetest.World {
		return migratetest.NewWorld(t, migratetest.Node("node-a", "cri-o://1.34.0"), migratetest.Node("node-b", "cri-o://1.34.0"), source.DeepCopy())
	}
	cfg := testConfig(migrate.MS2M)
	cfg.Transfer, cfg.ImageRepository = migrate.Direct, ""
	cfg.Broker.URL = "amqp://app:s3cret-pass@broker:5672/"
	steps := crashSteps(t, world, cfg)
	for n := 1; n < steps; n++ {
		w := world(t)
		rec := crashAt(t, w, cfg, n)
		journal := string(rec.Journal)
		for _, secret := range []string{"s3cret-pass", "directToken", "managedFields", "last-applied-configuration", "hunter2"} {
			if strings.Contains(journal, secret) {
				t.Fatalf("crashed at step %d: the journal holds %q", n, secret)
			}
		}
		got := recoverTwice(t, w, rec)
		if !got.Outcome.Final() {
			t.Fatalf("crashed at step %d: recovered to %s", n, got.Outcome)
		}
		if err := w.Conservation(); err != nil {
			t.Fatalf("crashed at step %d: %v", n, err)
		}
	}
}

// TestStatefulSetJournalKeepsNoPassword: a StatefulSet's pods carry the
// broker URL, password and all, in their template's annotation, and a
// migration saves the StatefulSet to create it again: the journal keeps
// the URL without the password, and the StatefulSet a recovery creates
// again has it back from the recovery's broker URL.
func TestStatefulSetJournalKeepsNoPassword(t *testing.T) {
	t.Parallel()
	const url = "amqp://app:s3cret-pass@broker:5672/"
	world := func(t *testing.T) *migratetest.World {
		w := migratetest.NewStatefulSetWorld(t)
		ctx := context.Background()
		sts, err := w.Client.AppsV1().StatefulSets("default").Get(ctx, "consumer", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sts.Spec.Template.Annotations = map[string]string{migrate.BrokerURLAnnotation: url}
		if _, err := w.Client.AppsV1().StatefulSets("default").Update(ctx, sts, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"consumer-0", "consumer-1"} {
			pod, err := w.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pod.Annotations = map[string]string{migrate.BrokerURLAnnotation: url}
			if _, err := w.Client.CoreV1().Pods("default").Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return w
	}
	cfg := stsConfig(migrate.MS2M, migrate.Sequential)
	cfg.Broker.URL = url
	steps := crashSteps(t, world, cfg)
	recreated := 0
	for n := 1; n < steps; n++ {
		w := world(t)
		rec := crashAt(t, w, cfg, n)
		if strings.Contains(string(rec.Journal), "s3cret-pass") {
			t.Fatalf("crashed at step %d: the journal holds the password", n)
		}
		got, err := migrate.Recover(context.Background(), rec, url, w.Deps(), migrate.Hooks{})
		if err != nil || !got.Outcome.Final() {
			t.Fatalf("crashed at step %d: recovered to %s: %v", n, got.Outcome, err)
		}
		sts, err := w.Client.AppsV1().StatefulSets("default").Get(context.Background(), "consumer", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("crashed at step %d: %v", n, err)
		}
		if a := sts.Spec.Template.Annotations[migrate.BrokerURLAnnotation]; a != url {
			t.Fatalf("crashed at step %d: the StatefulSet's template says %q, not %q", n, a, url)
		}
		if sts.UID != migratetest.StatefulSetUID {
			recreated++
		}
		if err := w.Conservation(); err != nil {
			t.Fatalf("crashed at step %d: %v", n, err)
		}
	}
	if recreated == 0 {
		t.Fatal("no recovery created the StatefulSet again: this proves nothing")
	}
}

// TestRecoverRefusesAForgedJournal: a journal is a ConfigMap anyone who may
// edit the namespace can rewrite, while recovery runs with its operator's
// rights. A journal naming what the migration never touches (another
// namespace's pod, another workload's queue, another image, another pod's
// archives, another migration), or one whose flags were flipped, is
// refused before anything changes: its signature no longer holds (the key
// is in the agents' namespace, out of the editor's reach); the genuine one then recovers with every message conserved.
func TestRecoverRefusesAForgedJournal(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{PhaseStarted: func(p report.PhaseTiming) {
			if p.Name == report.Restore {
				runtime.Goexit() // the process dies with images pushed and the replay queue bound
			}
		}})
	}()
	<-done
	w.ExpireLeases()
	genuine := w.Records()[0]
	for _, tc := range []struct {
		name  string
		forge func(*migrate.Journal)
	}{
		{"another namespace's pod", func(j *migrate.Journal) {
			j.State.Target = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "consumer-abcde"}}
		}},
		{"another workload's queue", func(j *migrate.Journal) { j.State.ReplayQueue = "orders" }},
		{"another image", func(j *migrate.Journal) {
			j.State.Images = map[string]string{"app": "registry:5000/ckpt/prod/db@sha256:abc"}
		}},
		{"another pod's archives", func(j *migrate.Journal) {
			j.State.Archives = map[string]string{"app": "/var/lib/kubelet/checkpoints/checkpoint-db_prod-app-*.tar"}
		}},
		{"another migration", func(j *migrate.Journal) { j.Config.Namespace = "prod" }},
		// Names nothing new: only the signature (a key in the agents'
		// namespace, which the editor cannot read) tells.
		{"committed flipped", func(j *migrate.Journal) { j.State.Committed = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var j migrate.Journal
			if err := json.Unmarshal(genuine.Journal, &j); err != nil {
				t.Fatal(err)
			}
			tc.forge(&j)
			forged := *genuine
			forged.Journal, _ = json.Marshal(j)
			before := len(w.Changes())
			_, err := migrate.Recover(context.Background(), &forged, "amqp://x", w.Deps(), migrate.Hooks{})
			if err == nil || !strings.Contains(err.Error(), "refusing its journal") {
				t.Fatalf("recovered from a forged journal: %v", err)
			}
			if after := w.Changes(); len(after) != before {
				t.Fatalf("the refused recovery did %v", after[before:])
			}
		})
	}
	if rec := recoverTwice(t, w, genuine); rec.Outcome != report.RolledBack {
		t.Fatalf("recovered to %s", rec.Outcome)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
}

// TestACrashInSetupLeavesNothingToRecover: a process killed in setup, once
// it holds the lock, leaves no journal and no record; the next migration is
// refused naming the recovery, which (finding no record) only releases the
// stale lease; then the pod migrates, every message once.
func TestACrashInSetupLeavesNothingToRecover(t *testing.T) {
	t.Parallel()
	w := migratetest.NewWorld(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = migrate.Run(context.Background(), testConfig(migrate.MS2M), w.Deps(), migrate.Hooks{
			Progress: func(phase report.PhaseName, msg string) {
				if phase == report.Setup && msg == "lock taken" {
					runtime.Goexit() // as SIGKILL would
				}
			},
		})
	}()
	<-done
	if records, leases := w.Records(), w.Leases(); len(records) != 0 || len(leases) != 1 {
		t.Fatalf("a crash in setup left %d records and leases %v, want none and the lock", len(records), leases)
	}
	w.ExpireLeases()
	next := testConfig(migrate.MS2M)
	next.ID, next.TargetName = "fghij", "consumer-fghij"
	if _, err := migrate.Run(context.Background(), next, w.Deps(), migrate.Hooks{}); err == nil || !strings.Contains(err.Error(), migrate.RecoverCommand("default", "abcde")) {
		t.Fatalf("the next migration was not pointed at recovery: %v", err)
	}
	if n, err := lease.ReleaseStale(context.Background(), w.Client, "default", "abcde"); err != nil || n != 1 {
		t.Fatalf("recovery released %d leases: %v", n, err)
	}
	if rec, err := migrate.Run(context.Background(), next, w.Deps(), migrate.Hooks{}); err != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("after the recovery: %v", err)
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
}

// TestRecoveryTakesThePasswordFromTheLiveAnnotation: the journal keeps the
// broker URL without its password; a recovery given none takes it from a
// live pod of the migration whose annotation names the same user and host,
// never from one that names another broker.
func TestRecoveryTakesThePasswordFromTheLiveAnnotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	j := migrate.Journal{Config: testConfig(migrate.MS2M)}
	j.Config.Broker.URL = "amqp://app:@broker:5672/"
	for _, tc := range []struct{ annotation, want string }{
		{"amqp://app:pw@broker:5672/", "amqp://app:pw@broker:5672/"},
		{"amqp://app:pw@elsewhere:5672/", ""},
		{"amqp://other:pw@broker:5672/", ""},
		{"amqp://app@broker:5672/", ""},
	} {
		source := migratetest.SourcePod()
		source.Annotations = map[string]string{migrate.BrokerURLAnnotation: tc.annotation}
		w := migratetest.NewWorld(t, migratetest.Node("node-a", "cri-o://1.34.0"), source)
		if got := migrate.LiveBrokerURL(ctx, w.Client, j); got != tc.want {
			t.Errorf("annotation %q: got %q, want %q", tc.annotation, got, tc.want)
		}
	}
}
