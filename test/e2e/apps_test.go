//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestInventoryExampleMigratesWithItsState migrates examples/inventory, an
// application written against the SDK with a state of its own (a stock
// ledger in memory, bodies of its own schema): live, with MS2M, and its
// ledger on the target after replay is exactly the one the producer booked
// over the orders the broker confirmed — not only the same message totals.
func TestInventoryExampleMigratesWithItsState(t *testing.T) {
	concurrent(t)
	_, w, rec, before, after := migrateLiveApp(t, workload.Options{App: "inventory", Rate: "20"}, 40)
	var was, is struct {
		SKUs   int    `json:"skus"`
		Digest string `json:"digest"`
	}
	if json.Unmarshal(before.App, &was) != nil || json.Unmarshal(after.App, &is) != nil || was.SKUs == 0 || is.Digest == "" {
		t.Fatalf("the inventory reports no ledger: before %s, after %s", before.App, after.App)
	}
	// The ledger the restored copy holds is the source's, carried by the
	// checkpoint and caught up by replay: CheckConservation compares it
	// with the producer's once both are at the same message.
	checkConservation(t, w, rec.TargetPod)
}

// TestPythonConsumerMigratesLive migrates examples/python, a consumer that
// shares no code with the Go SDK, live with MS2M: restored (same process),
// nothing lost or applied twice, and its sum equal to the producer's.
func TestPythonConsumerMigratesLive(t *testing.T) {
	concurrent(t)
	_, w, rec, _, _ := migrateLiveApp(t, workload.Options{App: "python", Rate: "10"}, 30)
	checkConservation(t, w, rec.TargetPod)
}

// TestPythonStatefulSetSequential moves ordinal 0 of a StatefulSet of
// Python consumers in sequential mode.
func TestPythonStatefulSetSequential(t *testing.T) {
	concurrent(t)
	migrateStatefulSet(t, func(_ string, sts *appsv1.StatefulSet) {
		c := &sts.Spec.Template.Spec.Containers[0]
		c.Image = strings.Replace(c.Image, "/ms2m-consumer:", "/python-consumer:", 1)
	}, "--strategy", "ms2m")
}

// TestQuickStartAsPrinted runs the README's quick start on the lab as "your
// cluster", each command as the README prints it: only what it marks EDIT
// (broker, registry) and what the lab needs (its agent image, its
// plain-HTTP registry, node-a for the pods, a namespace of the test's own)
// differ. The consumer then has every message once.
func TestQuickStartAsPrinted(t *testing.T) {
	concurrent(t)
	l := setup(t)
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	ns := "ms2m-demo-" + id
	w := workload.Attach(l.client, ns, ns, ns+".work")
	t.Cleanup(func() {
		if t.Failed() {
			l.dumpDiagnostics(t, w)
		}
		_ = w.Delete(context.Background())
	})
	edit := strings.NewReplacer(
		"ghcr.io/kubectl-migrate/", l.imagePrefix+"/", ":latest", ":lab",
		"amqp://guest:guest@rabbitmq.example:5672/", l.brokerURL,
		"registry.example:5000/checkpoints", l.registry+"/checkpoints",
		"ms2m-demo", ns,
		"spec:\n  containers:", "spec:\n  nodeName: node-a\n  containers:",
	)
	dir := t.TempDir()
	for _, name := range []string{"consumer-pod.yaml", "producer.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "examples", "manifests", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(edit.Replace(string(raw))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	commands := quickStart(t)
	if len(commands) < 6 {
		t.Fatalf("the README's quick start has %d commands: %q", len(commands), commands)
	}
	for _, command := range commands {
		args := strings.Fields(edit.Replace(command))[1:] // after "kubectl"
		for i, a := range args {
			args[i] = strings.Replace(a, "examples/manifests/", dir+"/", 1)
		}
		switch {
		case len(args) > 1 && args[0] == "migrate" && (args[1] == "check" || args[1] == "pod"):
			args = slices.Insert(args, 2, "--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab", "--insecure-registry")
		case len(args) > 1 && args[0] == "migrate" && args[1] == "node-setup":
			args = slices.Insert(args, 2, "--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab")
		}
		out, err := l.kubectlCommand(args...).CombinedOutput()
		t.Logf("kubectl %s:\n%s", strings.Join(args, " "), out)
		if err != nil {
			t.Fatalf("%s: %v", command, err)
		}
		if args[0] == "create" && args[1] == "namespace" {
			// The namespace's default service account appears a moment
			// later, before anyone could type the next command.
			l.waitDefaultServiceAccount(t, ns)
		}
		switch {
		case slices.Contains(args, "--dry-run"):
			if !strings.Contains(string(out), "Preflight passed") {
				t.Fatalf("the dry run printed no plan")
			}
		case len(args) > 1 && args[1] == "report":
			if !strings.Contains(string(out), "succeeded") {
				t.Fatalf("report lists no succeeded migration")
			}
		}
	}
	list, err := l.client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "migrate.ms2m.io/migration"})
	if err != nil || len(list.Items) != 1 || list.Items[0].Spec.NodeName != "node-b" {
		t.Fatalf("want one restored pod on node-b: %v %+v", err, list)
	}
	checkConservation(t, w, list.Items[0].Name)
}

// quickStart is the README's quick start: its commands, without comments.
func quickStart(t *testing.T) []string {
	return readmeCommands(t, "## Quick start on your own cluster")
}

// readmeCommands returns the commands of the first sh block after heading
// in README.md, comments dropped.
func readmeCommands(t *testing.T, heading string) []string {
	raw, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), heading+"\n")
	_, block, ok2 := strings.Cut(section, "```sh\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("README.md has no sh block under %q", heading)
	}
	var commands []string
	for _, line := range strings.Split(block, "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			commands = append(commands, line)
		}
	}
	return commands
}

// TestMakeDemoAsPrinted runs the README's "Try it" command as printed, from
// the repository's root, on the lab the tests run on (it is up, so the demo
// finds it so): the demo migrates its consumer, prints the report, and
// checks every message was applied exactly once.
func TestMakeDemoAsPrinted(t *testing.T) {
	l := setup(t)
	commands := readmeCommands(t, "## Try it locally")
	if len(commands) != 1 || commands[0] != "make demo" {
		t.Fatalf("the README's Try it block is %q", commands)
	}
	cmd := exec.Command("sh", "-c", commands[0])
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", commands[0], out)
	if _, rest, ok := strings.Cut(string(out), "deploying the sample workload in namespace "); ok {
		ns, _, _ := strings.Cut(rest, ":")
		t.Cleanup(func() { _ = workload.Attach(l.client, ns, "", "").Delete(context.Background()) })
	}
	if err != nil {
		t.Fatalf("%s: %v", commands[0], err)
	}
	for _, want := range []string{"already up", "downtime", "applied each exactly once"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the demo did not print %q", want)
		}
	}
}
