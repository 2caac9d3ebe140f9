//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestCheckpointRunByAnotherNamespaceNeverConsumes: after a migration, a pod
// of another namespace pinned to the target node names the checkpoint image
// (all it takes for the runtime to restore the victim's process into it).
// The restored copy finds itself in a pod no migration named, holds for
// good and consumes nothing: the victim conserves every message.
func TestCheckpointRunByAnotherNamespaceNeverConsumes(t *testing.T) {
	l, w, rec := migrateLivePod(t)
	if len(rec.Images) != 1 {
		t.Fatalf("images %v", rec.Images)
	}
	ctx := context.Background()
	thief := workload.Attach(l.client, fmt.Sprintf("attacker-%06x", rand.Uint32()>>8), w.Exchange, w.Queue)
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: thief.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = thief.Delete(context.Background()) })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "thief", Namespace: thief.Namespace},
		Spec: corev1.PodSpec{
			NodeName: "node-b",
			Containers: []corev1.Container{{
				Name: "consumer", Image: rec.Images[0], ImagePullPolicy: corev1.PullIfNotPresent,
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}
	// The namespace's default service account appears asynchronously.
	l.waitDefaultServiceAccount(t, thief.Namespace)
	if _, err := l.client.CoreV1().Pods(thief.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The runtime restores the victim's process into the thief's pod; once
	// it has reconnected it knows where it runs.
	st, err := thief.WaitFor(ctx, "thief", 2*time.Minute, func(st ms2m.State) bool { return st.Reconnects > 0 })
	if err != nil {
		t.Fatalf("the thief's copy never answered: %v (%+v)", err, st)
	}
	t.Logf("the thief's pod runs the victim's process %s: mode %s, foreign %q, homes %v", st.Process, st.Mode, st.Foreign, st.Homes)
	if victim := state(t, w, rec.TargetPod); st.Process != victim.Process {
		t.Fatalf("the thief's pod runs process %s, not the victim's %s: the runtime did not restore the checkpoint, so this proves nothing", st.Process, victim.Process)
	}
	if st.Foreign != thief.Namespace+"/thief" || st.Mode != ms2m.ModeHold {
		t.Fatalf("the copy in another namespace's pod does not hold as foreign: %+v", st)
	}
	if _, err := thief.Control(ctx, "thief", ms2m.Control{Type: ms2m.Resume}); err == nil {
		t.Fatal("the foreign copy obeyed RESUME")
	}
	// Whatever it consumed, the victim would lack.
	checkConservation(t, w, rec.TargetPod)
	if after, err := thief.State(ctx, "thief"); err != nil || after.Position() != st.Position() || after.Mode != ms2m.ModeHold {
		t.Fatalf("the foreign copy moved from %s: %+v (%v)", st.Position(), after, err)
	}
}

// TestAnotherNamespaceCannotDriveAnAgent: a serving agent (the CRI socket
// mounted, as on a migration's target) is called from a pod of another
// namespace on the same node, over the pod network as any pod can: without
// the migration's token, or with a guessed one, every endpoint refuses
// (401), so the attacker neither reads the runtime's config, nor stops a
// pod, nor removes archives; the migration's own call through the API
// server goes through.
func TestAnotherNamespaceCannotDriveAnAgent(t *testing.T) {
	l := setup(t)
	ctx := context.Background()
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	victim, attacker := "e2e-agent-"+id, "attacker-"+id
	for _, ns := range []string{victim, attacker} {
		if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
	node, err := l.client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	launcher := agent.Launcher{Client: l.client, Image: l.imagePrefix + "/kubectl-migrate-agent:lab", Namespace: victim,
		Labels: map[string]string{"app.kubernetes.io/name": "kubectl-migrate-agent", "e2e": id}, Serving: &agent.Serving{}}
	t.Cleanup(func() { _ = launcher.Release(context.Background()) })
	if err := launcher.Warm(ctx, "agent-"+id, "node-b", agent.WarmOptions{RuntimeSocket: agent.RuntimeSocket(node.Status.NodeInfo.ContainerRuntimeVersion)}); err != nil {
		t.Fatal(err)
	}
	pod, err := l.client.CoreV1().Pods(victim).Get(ctx, "agent-"+id, metav1.GetOptions{})
	if err != nil || pod.Status.PodIP == "" {
		t.Fatalf("the agent pod has no IP: %v", err)
	}
	// The attacker: Python's standard library, in a pod of its own namespace.
	script := fmt.Sprintf(`
import urllib.request, urllib.error
codes = []
for path, body in [("/runtime", "{}"), ("/stop-pod", '{"uid":"x"}'), ("/remove", '{"archives":["*"]}'), ("/pack", "{}"), ("/pull", '{"images":["x"]}')]:
    for token in (None, "guess"):
        req = urllib.request.Request("http://%s:%d" + path, data=body.encode(), method="POST")
        if token:
            req.add_header("%s", token)
        try:
            codes.append(urllib.request.urlopen(req, timeout=10).status)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
print("codes", *codes)
`, pod.Status.PodIP, agent.ServePort, agent.ControlTokenHeader)
	l.waitDefaultServiceAccount(t, attacker)
	thief := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "caller", Namespace: attacker},
		Spec: corev1.PodSpec{NodeName: "node-b", RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "caller", Image: l.imagePrefix + "/python-consumer:lab", Command: []string{"/usr/bin/python3", "-c", script},
		}}},
	}
	if _, err := l.client.CoreV1().Pods(attacker).Create(ctx, thief, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.WaitForPod(ctx, l.client, attacker, "caller", func(p *corev1.Pod) (bool, error) {
		return p != nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed), nil
	}); err != nil {
		t.Fatal(err)
	}
	logs, err := l.client.CoreV1().Pods(attacker).GetLogs("caller", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(logs)), "codes"+strings.Repeat(" 401", 10); got != want {
		t.Fatalf("another namespace's calls to the agent answered %q, want %q", got, want)
	}
	// The migration itself, with its token, is served.
	if info, err := launcher.Runtime(ctx, "node-b"); err != nil || info.Name == "" {
		t.Fatalf("the migration's own call: %+v %v", info, err)
	}
}
