//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// keyValueServer is a process that follows no contract: an in-memory
// key-value store over HTTP (GET /set?k=K&v=V answers "ok" once stored,
// /dump all of it with the process's start nonce and PID), with no
// broker, no annotations and no control endpoint.
const keyValueServer = `
import http.server, json, os, threading, urllib.parse, uuid
store, lock, nonce = {}, threading.Lock(), uuid.uuid4().hex
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        u = urllib.parse.urlparse(self.path); q = urllib.parse.parse_qs(u.query)
        if u.path == "/set":
            with lock: store[q["k"][0]] = q["v"][0]
            body = b"ok"
        else:
            with lock: body = json.dumps({"nonce": nonce, "pid": os.getpid(), "store": store}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
`

// kvDump is what keyValueServer's /dump answers.
type kvDump struct {
	Nonce string            `json:"nonce"`
	PID   int               `json:"pid"`
	Store map[string]string `json:"store"`
}

// TestCheckpointRestoreMovesAProcessWithoutTheContract: kubectl migrate
// pod, given no strategy and no broker, moves a pod that follows no
// contract with checkpoint/restore while a client writes to it without
// pause: the copy is the same process (its start nonce), holds every write
// the client saw acknowledged, and has the source's labels; the source is
// gone and the record names the downtime.
func TestCheckpointRestoreMovesAProcessWithoutTheContract(t *testing.T) {
	concurrent(t)
	moveKeyValueServer(t, func(l *lab, ns string) report.Record {
		rec, err, jerr := l.migrateAnyPod(t, ns, "kv", "")
		if err != nil || jerr != nil {
			t.Fatalf("migration: %v %v %s", err, jerr, rec.Outcome)
		}
		return rec
	})
}

// TestCheckpointRestoreRollsBackAProcessWithoutTheContract: the same move
// fails once the copy runs (an injected failure); the rollback deletes the
// copy and lets the source back on the network, where it takes writes
// again with every acknowledged one kept.
func TestCheckpointRestoreRollsBackAProcessWithoutTheContract(t *testing.T) {
	concurrent(t)
	moveKeyValueServer(t, func(l *lab, ns string) report.Record {
		rec, err, jerr := l.migrateAnyPod(t, ns, "kv", "restore")
		if err == nil || jerr != nil || rec.Outcome != report.RolledBack {
			t.Fatalf("migration with a failure in restore: %v %v %s", err, jerr, rec.Outcome)
		}
		return rec
	})
}

// TestRecoverAnyPodAfterCrash: the plugin moving keyValueServer's pod with
// checkpoint/restore while a client writes is killed at a step (with
// E2E_CRASH_MATRIX=all, at each step that journals); kubectl migrate
// recover undoes the move before its commit and finishes it after, and
// every acknowledged write is where the outcome says, in the same process.
func TestRecoverAnyPodAfterCrash(t *testing.T) {
	concurrent(t)
	for _, tc := range everyStep([]crashCase{
		{name: "checkpoint-restore/restore", args: []string{"--inject-crash", "restore"}, want: report.RolledBack},
		{name: "checkpoint-restore/cleanup", args: []string{"--inject-crash", "cleanup"}, want: report.Succeeded},
	}, withoutContract) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each case has a namespace and records of its own
			moveKeyValueServer(t, func(l *lab, ns string) report.Record {
				return l.crashAndRecover(t, workload.Attach(l.client, ns, "", ""), tc, "pod", "kv", "--registry", l.registry+"/checkpoints")
			})
		})
	}
}

// moveKeyValueServer runs keyValueServer's pod on node-a, has a client
// write to it without pause while move moves it (or fails to), and checks
// every acknowledged write is where move's outcome says, in the same
// process, and that the move left no agent.
func moveKeyValueServer(t *testing.T, move func(l *lab, ns string) report.Record) {
	l := setup(t)
	l.restoresSomeWay(t)
	ctx := context.Background()
	ns := l.startAnyPod(t, "kv", "/usr/bin/python3", "-u", "-c", keyValueServer)
	get := func(pod, path string, params map[string]string) ([]byte, error) {
		return l.podGet(ctx, ns, pod, path, params)
	}
	dump := func(pod string) kvDump {
		t.Helper()
		var d kvDump
		body, err := get(pod, "/dump", nil)
		if err == nil {
			err = json.Unmarshal(body, &d)
		}
		if err != nil {
			t.Fatalf("dump %s: %v", pod, err)
		}
		return d
	}
	var before kvDump
	for range 50 {
		if body, err := get("kv", "/dump", nil); err == nil && json.Unmarshal(body, &before) == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if before.Nonce == "" {
		t.Fatal("the key-value server never answered")
	}

	// The client writes key_i = i without pause, keeping what was
	// acknowledged, until the migration has ended.
	var log ackLog
	stopWriting := log.writeWithoutPause(func(i int) bool {
		k := strconv.Itoa(i)
		body, err := get("kv", "/set", map[string]string{"k": "key_" + k, "v": k})
		return err == nil && string(body) == "ok"
	})
	if !log.waitBeyond(20, 30*time.Second) {
		stopWriting()
		t.Fatal("the client's writes were not acknowledged")
	}

	rec := move(l, ns)
	stopWriting()
	acked := log.all()
	defer l.noAgentsLeft(t, ns)
	switch rec.Outcome {
	case report.RolledBack:
		sourceKeepsEveryWrite(t, l, ns, before, acked, get, dump)
		return
	case report.Succeeded:
	default:
		t.Fatalf("the move ended %s: %s", rec.Outcome, rec.Error)
	}
	if rec.Strategy != "checkpoint-restore" || rec.Downtime == nil || rec.Downtime.Millis <= 0 {
		t.Fatalf("strategy %s, downtime %+v", rec.Strategy, rec.Downtime)
	}

	if _, err := l.client.CoreV1().Pods(ns).Get(ctx, "kv", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the source is still there: %v", err)
	}
	target, err := l.client.CoreV1().Pods(ns).Get(ctx, rec.TargetPod, metav1.GetOptions{})
	if err != nil || target.Spec.NodeName != "node-b" || target.Labels["app"] != "kv" {
		t.Fatalf("the copy %s: %v", rec.TargetPod, err)
	}
	after := dump(rec.TargetPod)
	if after.Nonce != before.Nonce {
		t.Fatalf("the copy is another process (nonce %s, was %s): started afresh, not restored", after.Nonce, before.Nonce)
	}
	keepsEveryWrite(t, after, acked)
	t.Logf("%d acknowledged writes, all in the copy (%d keys); downtime %d ms", len(acked), len(after.Store), rec.Downtime.Millis)
}

// anyPodMemoryLimit is the memory limit of startAnyPod's pods, as a
// platform team sets one: where metrics.k8s.io is not served (the lab),
// the freeze a move predicts is bounded by it.
var anyPodMemoryLimit = resource.MustParse("1Gi")

// startAnyPod runs a pod called name (labelled app=name) on node-a in a
// namespace of its own, with the lab's Debian image (python3, pika,
// redis-server) running command under anyPodMemoryLimit, and returns the
// namespace once the pod runs with an IP.
func (l *lab) startAnyPod(t testing.TB, name string, command ...string) string {
	t.Helper()
	return l.startAnyPodWith(t, name, nil, command...)
}

// startAnyPodWith is startAnyPod with change made to the pod before it is
// created.
func (l *lab) startAnyPodWith(t testing.TB, name string, change func(*corev1.Pod), command ...string) string {
	t.Helper()
	ctx := context.Background()
	ns := fmt.Sprintf("e2e-%s-%06x", name, rand.Uint32()>>8)
	l.namespaces(t, ns)
	l.waitDefaultServiceAccount(t, ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{
			Name: name, Image: l.imagePrefix + "/python-consumer:lab", Command: command,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: anyPodMemoryLimit}},
		}}},
	}
	if change != nil {
		change(pod)
	}
	if _, err := l.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.WaitForPod(ctx, l.client, ns, name, func(p *corev1.Pod) (bool, error) {
		return p != nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// podGet asks pod's port 8080 for path through the API server's proxy
// (the lab has no kube-proxy), giving it two seconds.
func (l *lab) podGet(ctx context.Context, ns, pod, path string, params map[string]string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return l.client.CoreV1().Pods(ns).ProxyGet("http", pod, "8080", path, params).DoRaw(ctx)
}

// ackLog is a client's log of the writes key_i = i it saw acknowledged.
type ackLog struct {
	mu    sync.Mutex
	acked []int
}

func (a *ackLog) add(i int) {
	a.mu.Lock()
	a.acked = append(a.acked, i)
	a.mu.Unlock()
}

func (a *ackLog) all() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.acked)
}

// writeWithoutPause calls write(i) for i = 0, 1, … one after another,
// logging each i it reports acknowledged, until the stop it returns is
// called; stop returns once the write in flight has ended.
func (a *ackLog) writeWithoutPause(write func(i int) bool) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-quit:
				return
			default:
			}
			if write(i) {
				a.add(i)
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

// waitBeyond waits until more than n writes were acknowledged, or timeout
// has passed (false).
func (a *ackLog) waitBeyond(n int, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if len(a.all()) > n {
			return true
		}
	}
	return false
}

// migrateAnyPod runs kubectl migrate pod on pod, given no strategy and no
// broker, to node-b (with failAt, failing it there), and returns its record,
// the command's error and the record's decoding error.
func (l *lab) migrateAnyPod(t *testing.T, ns, pod, failAt string) (rec report.Record, err, jerr error) {
	t.Helper()
	var extra []string
	if failAt != "" {
		extra = []string{"--inject-failure", failAt}
	}
	return l.migrateWithoutContract(t, "pod", ns, pod, extra...)
}

// migrateWithoutContract is migrateAnyPod with the command (pod or sts)
// and extra flags.
func (l *lab) migrateWithoutContract(t testing.TB, command, ns, pod string, extra ...string) (rec report.Record, err, jerr error) {
	t.Helper()
	argv := []string{"migrate", "-n", ns, command, pod, "--to", "node-b", "--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab",
		"--insecure-registry", "--allow-anonymous-checkpoints", "--registry", l.registry + "/checkpoints", "-o", "json"}
	argv = append(argv, extra...)
	cmd := l.kubectlCommand(argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	t.Logf("kubectl %s:\n%s", strings.Join(argv, " "), stderr.String())
	if jerr = json.Unmarshal(stdout.Bytes(), &rec); jerr != nil {
		jerr = fmt.Errorf("%w:\n%s", jerr, stdout.String())
	}
	return rec, err, jerr
}

// keepsEveryWrite fails unless d holds every acknowledged write.
func keepsEveryWrite(t *testing.T, d kvDump, acked []int) {
	t.Helper()
	var lost []int
	for _, i := range acked {
		if d.Store["key_"+strconv.Itoa(i)] != strconv.Itoa(i) {
			lost = append(lost, i)
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes lost, e.g. %v", len(lost), len(acked), lost[:min(len(lost), 10)])
	}
}

// sourceKeepsEveryWrite checks, after a rollback, that the copy is gone and
// the source, the same process, is back on the network (it takes a write)
// with every acknowledged write.
func sourceKeepsEveryWrite(t *testing.T, l *lab, ns string, before kvDump, acked []int, get func(string, string, map[string]string) ([]byte, error), dump func(string) kvDump) {
	t.Helper()
	pods, err := l.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].Name != "kv" || pods.Items[0].Spec.NodeName != "node-a" {
		t.Fatalf("after the rollback the pods are %v (%v), want kv on node-a alone", podNames(pods), err)
	}
	if body, err := get("kv", "/set", map[string]string{"k": "after", "v": "rollback"}); err != nil || string(body) != "ok" {
		t.Fatalf("the source is still cut off after the rollback: %v", err)
	}
	d := dump("kv")
	if d.Nonce != before.Nonce {
		t.Fatalf("the source restarted (nonce %s, was %s)", d.Nonce, before.Nonce)
	}
	keepsEveryWrite(t, d, acked)
	t.Logf("rolled back: %d acknowledged writes, all in the source, which takes writes again", len(acked))
}

func podNames(pods *corev1.PodList) []string {
	if pods == nil {
		return nil
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name+"@"+p.Spec.NodeName)
	}
	return names
}
