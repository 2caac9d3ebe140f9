//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/check"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// runCheck runs kubectl migrate check in a namespace of its own, with the
// lab's registry and agent image; args come last and so win.
func (l *lab) runCheck(t *testing.T, from, to string, args ...string) (check.Result, string, error) {
	t.Helper()
	return l.runCheckWith(t, from, to, append([]string{"--registry", l.registry + "/checkpoints", "--insecure-registry"}, args...)...)
}

// runCheckWith is runCheck with no registry unless args name one.
func (l *lab) runCheckWith(t *testing.T, from, to string, args ...string) (check.Result, string, error) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "check-"}}
	ns, err := l.client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	argv := append([]string{"migrate", "check", "-n", ns.Name, "--from", from, "--to", to,
		"--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab", "-o", "json"}, args...)
	cmd := l.kubectlCommand(argv...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("kubectl %s:\n%s", strings.Join(argv, " "), stderr.String())
	var res check.Result
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("not a check result: %v\n%s", jerr, out)
	}
	l.checkLeftNothing(t, ns.Name, res)
	return res, stderr.String(), err
}

// checkLeftNothing: no pod in the check's namespace, no archive on either
// node, no checkpoint image in the registry.
func (l *lab) checkLeftNothing(t *testing.T, ns string, res check.Result) {
	t.Helper()
	pods, err := l.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Fatalf("check left pods in %s: %v %v", ns, len(pods.Items), err)
	}
	secrets, err := l.client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=kubectl-migrate"})
	if err != nil || len(secrets.Items) != 0 {
		t.Fatalf("check left secrets in %s: %v %v", ns, len(secrets.Items), err)
	}
	for _, node := range []string{"node-a", "node-b"} {
		l.nothingStaged(t, node)
		archives, _ := filepath.Glob(filepath.Join(env(t, "LAB_RUN"), node, "kubelet", "checkpoints", "*_"+ns+"-*"))
		if len(archives) != 0 {
			t.Fatalf("check left archives on %s: %v", node, archives)
		}
	}
	if res.Image != "" {
		ref, err := name.ParseReference(res.Image, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := remote.Head(ref); err == nil {
			t.Fatalf("check left its checkpoint image %s", res.Image)
		}
	}
}

func link(res check.Result, name string) check.Link {
	for _, l := range res.Links {
		if l.Name == name {
			return l
		}
	}
	return check.Link{}
}

// TestCheckPasses: both ways between the lab's nodes, every link holds and
// the restored canary is the checkpointed process, pinging again.
func TestCheckPasses(t *testing.T) {
	l := setup(t)
	for _, dir := range [][2]string{{"node-a", "node-b"}, {"node-b", "node-a"}} {
		res, stderr, err := l.runCheck(t, dir[0], dir[1])
		if err != nil || !res.OK() {
			t.Fatalf("check %s → %s: %v\n%+v\n%s", dir[0], dir[1], err, res.Links, stderr)
		}
		if d := link(res, check.LinkSameProcess).Detail; !strings.Contains(d, "went on") {
			t.Fatalf("same process: %q", d)
		}
		// Progress on stderr, one line per link.
		if n := strings.Count(stderr, "✓"); n != len(res.Links) {
			t.Fatalf("%d progress lines for %d links:\n%s", n, len(res.Links), stderr)
		}
	}
	// No registry: the checkpoint goes node to node, and the target's
	// runtime restores it from its agent.
	res, stderr, err := l.runCheckWith(t, "node-a", "node-b")
	if err != nil || !res.OK() || res.Image != "" {
		t.Fatalf("check without a registry: %v\n%+v\n%s", err, res.Links, stderr)
	}
	if d := link(res, check.LinkPush).Detail; !strings.Contains(d, "node to node") {
		t.Fatalf("transfer without a registry: %q", d)
	}
}

// TestCheckUnpullableAgentImage: the agent image link fails naming
// --agent-image; nothing after it is tried, and nothing is left.
func TestCheckUnpullableAgentImage(t *testing.T) {
	l := setup(t)
	res, _, err := l.runCheck(t, "node-a", "node-b", "--agent-image", l.registry+"/nope/kubectl-migrate-agent:missing")
	bad := link(res, check.LinkAgents)
	if exitCode(err) != 6 || bad.Status != check.Failed || !strings.Contains(bad.Remedy, "--agent-image") {
		t.Fatalf("want the agent image link failed naming --agent-image, exit 6; got %v %+v", err, res.Links)
	}
	if link(res, check.LinkCheckpoint).Status != check.Skipped || link(res, check.LinkCleanup).Status != check.OK {
		t.Fatalf("links after the failure: %+v", res.Links)
	}
}

// TestRestoreOptIn (containerd lane): a target whose runtime was left at
// its default (restore off) fails check with the setting, and a migration
// to it is refused before any change with the same setting;
// with the setting on, both pass.
func TestRestoreOptIn(t *testing.T) {
	if os.Getenv("LAB_RUNTIME") != "containerd" {
		t.Skip("the lab's CRI-O 1.34.0 has no restore opt-in; run on the containerd lane (LAB_RUNTIME=containerd)")
	}
	l := setup(t)
	labRestore(t, "node-b", "off")
	t.Cleanup(func() { labRestore(t, "node-b", "on") })
	const setting = "enable_experimental_restore_via_create = true"

	res, _, err := l.runCheck(t, "node-a", "node-b")
	if bad := link(res, check.LinkRuntimeRestore); err == nil || bad.Status != check.Failed || !strings.Contains(bad.Remedy, setting) {
		t.Fatalf("want the runtime restore link failed naming %q, got %v %+v", setting, err, res.Links)
	}

	w, before := l.refusedBeforeAnyChange(t, setting)

	labRestore(t, "node-b", "on")
	if res, _, err := l.runCheck(t, "node-a", "node-b"); err != nil || !res.OK() {
		t.Fatalf("check with restore on: %v %+v", err, res.Links)
	}
	rec, _, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b")
	if err != nil {
		t.Fatalf("migration with restore on: %v", err)
	}
	l.checkMigrated(t, w, rec, before)
	checkConservation(t, w, rec.TargetPod)
}

// TestTheRuntimeRestoresWhereContainerdCannot (containerd-2.4 lane):
// containerd 2.4 has no CRI restore, so check fails and a migration is
// refused in preflight, both naming node-setup, with the source untouched;
// after node-setup both pass, the migration restoring through the runtime
// without being told to (--restore auto); node-setup --uninstall refuses
// while the restored pod runs and waits for it once it is being deleted;
// after it, check fails again. It is TestRestoreOptIn's twin, and here, in
// file order, before every other serial test that needs the runtime: it
// alone needs it absent, and those after it share one installation.
func TestTheRuntimeRestoresWhereContainerdCannot(t *testing.T) {
	if criRestores() {
		t.Skip("needs a runtime without CRI restore: run on the containerd-2.4 lane (LAB_RUNTIME=containerd-2.4)")
	}
	l := setup(t)
	dropRuntime(t) // an earlier test's, kept: check must find no way to restore
	const remedy = "kubectl migrate node-setup node-b"
	res, _, err := l.runCheck(t, "node-a", "node-b")
	if bad := link(res, check.LinkNodes); err == nil || bad.Status != check.Failed || !strings.Contains(bad.Remedy, remedy) {
		t.Fatalf("want the nodes link failed naming %q, got %v %+v", remedy, err, res.Links)
	}
	w, before := l.refusedBeforeAnyChange(t, remedy)

	uninstall := l.setUpRuntime(t)
	if res, _, err := l.runCheck(t, "node-a", "node-b"); err != nil || !res.OK() {
		t.Fatalf("check after node-setup: %v %+v", err, res.Links)
	}
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b")
	if err != nil {
		t.Fatalf("migration after node-setup: %v\n%s", err, stderr)
	}
	if target, err := l.client.CoreV1().Pods(w.Namespace).Get(context.Background(), rec.TargetPod, metav1.GetOptions{}); err != nil || !runtimeRestored(target) {
		t.Fatalf("the target was not restored through the runtime: %v", err)
	}
	l.checkMigrated(t, w, rec, before)
	checkConservation(t, w, rec.TargetPod)

	// node-setup --uninstall refuses while the restored pod runs under the
	// RuntimeClass, and waits for it once it is being deleted.
	if out, err := l.kubectlCommand("migrate", "node-setup", "--all", "--uninstall", "--yes", "--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab").CombinedOutput(); err == nil || !strings.Contains(string(out), w.Namespace+"/"+rec.TargetPod) {
		t.Fatalf("node-setup --uninstall with %s running under the RuntimeClass: %v\n%s", rec.TargetPod, err, out)
	}
	if err := l.client.CoreV1().Pods(w.Namespace).Delete(context.Background(), rec.TargetPod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	uninstall()
	if res, _, err := l.runCheck(t, "node-a", "node-b"); err == nil || link(res, check.LinkNodes).Status != check.Failed {
		t.Fatalf("check after node-setup --uninstall: %v %+v", err, res.Links)
	}
}

// refusedBeforeAnyChange deploys the workload and has its migration to
// node-b (with args) refused (exit 3: in preflight, or in setup where only
// the agents can tell) with one line naming remedy; the source must be
// undisturbed and nothing of the migration left. It returns the workload
// and the source's state before.
func (l *lab) refusedBeforeAnyChange(t *testing.T, remedy string, args ...string) (*workload.Workload, protocol.State) {
	t.Helper()
	w := l.deploy(t, "10")
	before := waitApplied(t, w, "consumer", 10)
	_, stderr, err := l.migrate(t, w, append([]string{"pod", "consumer", "--to", "node-b"}, args...)...)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; exitCode(err) != 3 || !strings.Contains(last, remedy) {
		t.Fatalf("want a refusal (exit 3) with one error line naming %q, got %v:\n%s", remedy, err, stderr)
	}
	if st := state(t, w, "consumer"); st.Mode != protocol.ModePrimary || st.PendingRestore || st.Process != before.Process {
		t.Fatalf("the source was disturbed: %+v", st)
	}
	l.nothingLeft(t, w)
	return w, before
}

// labRestore turns a lab node's restore opt-in on or off.
func labRestore(t *testing.T, node, value string) {
	t.Helper()
	cmd := exec.Command("go", "run", "./test/lab", "restore", node, value)
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("lab restore %s %s: %v\n%s", node, value, err, out)
	}
}
