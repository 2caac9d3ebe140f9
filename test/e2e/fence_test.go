//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
)

// fencedServer serves GET / on 8080 and, every 100 ms, tries to reach the
// lab's registry, printing each change of that outcome: what a process
// without the MS2M contract does, answering requests and writing out.
const fencedServer = `
import http.server, socket, threading, time, sys
def probe(host, port):
    last = None
    while True:
        try:
            socket.create_connection((host, port), timeout=0.3).close(); now = "out ok"
        except OSError:
            now = "out cut"
        if now != last:
            print(now, flush=True); last = now
        time.sleep(0.1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"served")
    def log_message(self, *a): pass
host, port = sys.argv[1].rsplit(":", 1)
threading.Thread(target=probe, args=(host, int(port)), daemon=True).start()
http.server.ThreadingHTTPServer(("", 8080), H).serve_forever()
`

// TestAFenceCutsAPodOffAndOutlivesItsCheckpoint: the source node's agent
// fences a running pod that follows no contract: requests no longer reach
// it and it reaches nothing, though it runs on; the kubelet's checkpoint
// of the fenced pod succeeds and leaves the fence in place (CRIU locks and
// unlocks the network around its dump); lifting the fence lets traffic
// through again. An agent acting for another namespace cannot fence it.
func TestAFenceCutsAPodOffAndOutlivesItsCheckpoint(t *testing.T) {
	concurrent(t)
	l := setup(t)
	ctx := context.Background()
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	ns, other := "e2e-fence-"+id, "attacker-"+id
	l.namespaces(t, ns, other)
	l.waitDefaultServiceAccount(t, ns)
	server := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{
			Name: "server", Image: l.imagePrefix + "/python-consumer:lab",
			Command: []string{"/usr/bin/python3", "-u", "-c", fencedServer, l.registry},
		}}},
	}
	if _, err := l.client.CoreV1().Pods(ns).Create(ctx, server, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := kube.WaitForPod(ctx, l.client, ns, "server", func(p *corev1.Pod) (bool, error) {
		return p != nil && p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	served := func() bool {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		body, err := l.client.CoreV1().Pods(ns).ProxyGet("http", "server", "8080", "/", nil).DoRaw(c)
		return err == nil && string(body) == "served"
	}
	// The last line the server printed about its way out.
	out := func() string {
		logs, err := l.client.CoreV1().Pods(ns).GetLogs("server", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return err.Error()
		}
		lines := strings.Split(strings.TrimSpace(string(logs)), "\n")
		return lines[len(lines)-1]
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("%s: not within 30 s (served: %v, way out: %q)", what, served(), out())
		}
	}
	until("the server serves and reaches out", func() bool { return served() && out() == "out ok" })

	node, err := l.client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	opts := agent.WarmOptions{RuntimeSocket: agent.RuntimeSocket(node.Status.NodeInfo.ContainerRuntimeVersion), Fence: true}
	launcher := func(appNamespace string) agent.Launcher {
		lr := agent.Launcher{Client: l.client, Image: l.imagePrefix + "/kubectl-migrate-agent:lab", Namespace: agent.DefaultNamespace, AppNamespace: appNamespace,
			Labels: map[string]string{"app.kubernetes.io/name": "kubectl-migrate-agent", "e2e": appNamespace}, Serving: &agent.Serving{}}
		t.Cleanup(func() { _ = lr.Release(context.Background()) })
		if err := lr.Warm(ctx, "agent-"+appNamespace, "node-a", opts); err != nil {
			t.Fatal(err)
		}
		return lr
	}
	own := launcher(ns)

	// Another namespace's agent, fencing as the migration would.
	if _, err := launcher(other).Fence(ctx, "node-a", string(pod.UID), false); err == nil || !strings.Contains(err.Error(), fmt.Sprint(http.StatusForbidden)) && !strings.Contains(err.Error(), "acts for namespace") {
		t.Fatalf("an agent of another namespace fenced the pod: %v", err)
	}
	if !served() {
		t.Fatal("the pod stopped serving after another namespace's attempt")
	}

	for range 2 { // fencing is idempotent
		res, err := own.Fence(ctx, "node-a", string(pod.UID), false)
		if err != nil || len(res.Netns) != 1 {
			t.Fatalf("fence: %+v %v", res, err)
		}
	}
	until("the fenced pod is cut off both ways", func() bool { return !served() && out() == "out cut" })

	checkpointed, err := own.Checkpoint(ctx, "node-a", agent.CheckpointRequest{Namespace: ns, Pod: "server", UID: string(pod.UID), Container: "server", TimeoutSeconds: 60})
	if err != nil {
		t.Fatalf("the kubelet could not checkpoint the fenced pod: %v", err)
	}
	if err := own.Remove(ctx, "remove-"+id, "node-a", []string{checkpointed.Archive}); err != nil {
		t.Fatal(err)
	}
	// Still cut off, a while after CRIU unlocked the network it dumped.
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Second, true, func(context.Context) (bool, error) {
		return served() || out() != "out cut", nil
	}); err == nil {
		t.Fatalf("the checkpoint lifted the fence (served: %v, way out: %q)", served(), out())
	}

	if _, err := own.Fence(ctx, "node-a", string(pod.UID), true); err != nil {
		t.Fatal(err)
	}
	until("the freed pod serves and reaches out again", func() bool { return served() && out() == "out ok" })
	if p, err := l.client.CoreV1().Pods(ns).Get(ctx, "server", metav1.GetOptions{}); err != nil || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("the server did not run through it all: %v", err)
	}
}
