package plugin

import (
	"context"
	"encoding/json"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// drainWorld has the sample consumer (an MS2M pod) and a pod without the
// contract on node-a.
func drainWorld(t *testing.T) *migratetest.World {
	consumer := migratetest.SourcePod()
	consumer.Annotations = map[string]string{migrate.QueueAnnotation: "work"}
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "default"},
		Spec:   corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	w := migratetest.NewWorld(t, []runtime.Object{migratetest.Node("node-a", "cri-o://1.34.0"), migratetest.Node("node-b", "cri-o://1.34.0"), consumer, plain}...)
	w.Apps["plain"] = &protocol.State{Process: "plain-1"} // its process, which its checkpoint carries
	return w
}

func TestNodeDryRunPrintsThePlanAndChangesNothing(t *testing.T) {
	w := drainWorld(t)
	flags := []string{"node", "node-a", "--to", "node-b", "--dry-run", "--registry", "reg:5000/ckpt"}
	r := execute(t, w, append(flags, "--broker-url", "amqp://x", "--exchange", "ex")...)
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, r.errOut)
	}
	for _, want := range []string{"migrate default/consumer → node-b  [pod, ms2m]\n", "migrate default/plain → node-b  [pod, checkpoint-restore]  (freeze unknown: neither metrics.k8s.io nor a memory limit tells its memory)", "Nothing was changed"} {
		if !strings.Contains(r.out.String(), want) {
			t.Errorf("plan lacks %q:\n%s", want, r.out)
		}
	}
	// A strategy that needs the contract leaves the pod without it, with
	// the engine's reason, before anything changes.
	r = execute(t, w, append(flags, "--strategy", "ms2m")...)
	if want := "leave   default/plain: broker URL, exchange and queue are required for --strategy ms2m"; r.err != nil || !strings.Contains(r.out.String(), want) {
		t.Errorf("%v: plan lacks %q:\n%s%s", r.err, want, r.out, r.errOut)
	}
	n, _ := w.Client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if n.Spec.Unschedulable || len(w.Changes()) != 0 || len(w.Records()) != 0 {
		t.Fatalf("a dry run changed the cluster: cordoned %v, %v", n.Spec.Unschedulable, w.Changes())
	}
}

// The drain migrates the consumer (MS2M) and the pod without the contract
// (checkpoint/restore) through the engine, with the pod's and the flags'
// settings, and records both.
func TestNodeDrainsThroughTheEngine(t *testing.T) {
	w := drainWorld(t)
	r := execute(t, w, "node", "node-a", "--to", "node-b", "-o", "json", "--registry", "reg:5000/ckpt", "--allow-anonymous-checkpoints", "--broker-url", "amqp://x", "--exchange", "ex")
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, r.errOut)
	}
	var rec report.Record
	if err := json.Unmarshal(r.out.Bytes(), &rec); err != nil || rec.Drain == nil {
		t.Fatalf("not a drain record: %v\n%s", err, r.out)
	}
	if len(rec.Drain.Moves) != 2 || len(rec.Drain.Skipped) != 0 || rec.Outcome != report.Succeeded {
		t.Fatalf("drain %+v", rec.Drain)
	}
	strategies := map[string]string{}
	for _, mv := range rec.Drain.Moves {
		var migration *report.Record
		for _, saved := range w.Records() {
			if saved.ID == mv.Migration {
				migration = saved
			}
		}
		if mv.Outcome != report.Succeeded || migration == nil || migration.Outcome != report.Succeeded || migration.Labels["drain"] != rec.ID || migration.TargetNode != "node-b" {
			t.Fatalf("%s's own record: %+v", mv.Pod, migration)
		}
		strategies[mv.Pod] = string(migration.Strategy)
	}
	if strategies["consumer"] != string(migrate.MS2M) || strategies["plain"] != string(migrate.CheckpointRestore) {
		t.Fatalf("strategies %v", strategies)
	}
	n, _ := w.Client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if !n.Spec.Unschedulable {
		t.Fatal("node-a is not cordoned")
	}
	list := execute(t, w, "report")
	if !strings.Contains(list.out.String(), rec.ID) || !strings.Contains(list.out.String(), "drain") {
		t.Fatalf("report does not list the drain:\n%s", list.out)
	}
	detail := execute(t, w, "report", rec.ID)
	if !strings.Contains(detail.out.String(), "default/consumer") || !strings.Contains(detail.out.String(), "default/plain") {
		t.Fatalf("report of the drain:\n%s", detail.out)
	}
}

// A drain whose process died: recover ends each migration it had started
// and the drain's record, and says the node stays cordoned.
func TestRecoverADrain(t *testing.T) {
	w := drainWorld(t)
	drain := &report.Record{ID: "dr41n", Strategy: report.DrainStrategy, Namespace: "default", Pod: "node-a", SourceNode: "node-a", Outcome: report.Running,
		Drain: &report.Drain{Moves: []report.DrainMove{
			{Namespace: "default", Pod: "consumer", Target: "node-b", Migration: "gone1", Outcome: report.Running},
			{Namespace: "default", Pod: "other", Target: "node-b", Migration: "done1", Outcome: report.Succeeded},
		}}}
	if err := (report.Store{Client: w.Client}).Save(context.Background(), drain); err != nil {
		t.Fatal(err)
	}
	list := execute(t, w, "report")
	if !strings.Contains(list.out.String(), "interrupted") || !strings.Contains(list.errOut.String(), "kubectl migrate recover dr41n") {
		t.Fatalf("report does not point at the drain's recovery:\n%s\nstderr:\n%s", list.out, list.errOut)
	}
	r := execute(t, w, "recover", "dr41n", "-o", "json")
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, r.errOut)
	}
	saved, err := report.Store{Client: w.Client}.Get(context.Background(), "default", "dr41n")
	if err != nil || saved.Outcome != report.Failed || saved.Drain.Moves[0].Outcome != report.NotStarted || saved.Drain.Moves[1].Outcome != report.Succeeded {
		t.Fatalf("drain after recovery %v: %+v", err, saved)
	}
	if !strings.Contains(r.errOut.String(), "node-a stays cordoned") {
		t.Fatalf("stderr:\n%s", r.errOut)
	}
}

// A checkpoint/restore migration (no broker) whose process died once its
// source was cut off the network: recover, given no broker, rolls it back
// and lets the source back on.
func TestRecoverAMigrationWithoutABroker(t *testing.T) {
	w := migratetest.NewWorld(t)
	w.NoContract = true
	cfg := migrate.Config{
		ID: "cr1sh", Strategy: migrate.CheckpointRestore, Namespace: "default", Pod: "consumer", TargetNode: "node-b", TargetName: "consumer-cr1sh",
		ImageRepository: "registry:5000/ckpt", AgentImage: "agent:1", AllowAnonymousCheckpoints: true, ControlPort: 8080,
		CheckpointTimeout: time.Second, PhaseTimeout: 5 * time.Second, ReplayTimeout: 5 * time.Second, Timeout: time.Minute, PredictWindow: -1,
	}
	died := make(chan struct{})
	go func() {
		defer close(died)
		_, _ = migrate.Run(context.Background(), cfg, w.Deps(), migrate.Hooks{PhaseStarted: func(p report.PhaseTiming) {
			if p.Name == report.Checkpoint {
				goruntime.Goexit() // as a SIGKILL ends the process
			}
		}})
	}()
	<-died
	w.ExpireLeases()
	w.Mu.Lock()
	cut := w.Isolated["consumer"]
	w.Mu.Unlock()
	if !cut {
		t.Fatal("the source was not cut off before the crash")
	}
	r := execute(t, w, "recover", "cr1sh", "-o", "json")
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, r.errOut)
	}
	saved, err := report.Store{Client: w.Client}.Get(context.Background(), "default", "cr1sh")
	if err != nil || saved.Outcome != report.RolledBack {
		t.Fatalf("after recovery %v: %+v", err, saved)
	}
	w.Mu.Lock()
	cut = w.Isolated["consumer"]
	w.Mu.Unlock()
	if cut {
		t.Fatal("the source is still cut off after the recovery")
	}
	if err := w.Conservation(); err != nil {
		t.Fatal(err)
	}
}

// A dry run of a move without the contract predicts its freeze from the
// pod's memory (here its limit: the fake serves no metrics.k8s.io).
func TestPodDryRunPredictsTheFreeze(t *testing.T) {
	w := drainWorld(t)
	plain, err := w.Client.CoreV1().Pods("default").Get(context.Background(), "plain", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plain.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	if _, err := w.Client.CoreV1().Pods("default").Update(context.Background(), plain, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := execute(t, w, "pod", "plain", "--to", "node-b", "--dry-run", "--registry", "reg:5000/ckpt", "--allow-anonymous-checkpoints")
	want := "Expected (checkpoint/restore: its clients wait through the freeze, which grows with its memory):\n  freeze ≤ 10.6s for its memory limit of 1024 MiB (metrics.k8s.io does not tell what it uses), at the lab's rate"
	if r.err != nil || !strings.Contains(r.out.String(), want) {
		t.Fatalf("%v: the plan lacks %q:\n%s%s", r.err, want, r.out, r.errOut)
	}
}
