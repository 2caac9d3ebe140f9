package check

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
)

func testConfig() Config {
	return Config{ID: "abcde", Namespace: "default", From: "node-a", To: "node-b", ImageRepository: "reg:5000/ckpt", AgentImage: "agent:test"}
}

// statuses lists each link's status, in order.
func statuses(r Result) string {
	var s []string
	for _, l := range r.Links {
		s = append(s, l.Name+"="+string(l.Status))
	}
	return strings.Join(s, " ")
}

// A failed link stops the check there: later links are skipped, cleanup
// still runs, and nothing was created.
func TestFailedLinkSkipsTheRest(t *testing.T) {
	w := migratetest.NewWorld(t)
	cfg := testConfig()
	cfg.To = "node-z"
	var seen []string
	var started []string
	r := Run(context.Background(), cfg, w.Deps(), Hooks{
		LinkStarted: func(name string) { started = append(started, name) },
		LinkEnded:   func(l Link) { seen = append(seen, l.Name) },
	})
	want := "permissions=ok nodes=failed agent image=skipped runtime restore=skipped canary=skipped checkpoint=skipped transfer=skipped node pull=skipped restore=skipped same process=skipped cleanup=ok"
	if got := statuses(r); got != want || r.OK() {
		t.Fatalf("links %s\nwant  %s", got, want)
	}
	if bad := r.Links[1]; !strings.Contains(bad.Detail, "node-z not found") || !strings.Contains(bad.Remedy, "kubectl get nodes") {
		t.Fatalf("nodes link: %+v", bad)
	}
	if len(seen) != len(r.Links) {
		t.Fatalf("the hook saw %v", seen)
	}
	if strings.Join(started, ",") != "permissions,nodes,cleanup" {
		t.Fatalf("links started: %v; want only those that ran", started)
	}
	if changes := w.Changes(); len(changes) != 0 {
		t.Fatalf("a failed check changed %v", changes)
	}
}

// A target whose runtime reports restore off is refused before the
// canary exists, naming the setting.
func TestRestoreOffRefusedBeforeTheCanary(t *testing.T) {
	w := migratetest.NewWorld(t)
	n, _ := w.Client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{})
	n.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.3.7"
	_, _ = w.Client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
	w.RuntimeConfig = map[string]string{"node-b": `{"enableCRIU":true,"enableExperimentalRestoreViaCreate":false}`}
	r := Run(context.Background(), testConfig(), w.Deps(), Hooks{})
	bad := r.Links[3]
	if bad.Name != LinkRuntimeRestore || bad.Status != Failed || !strings.Contains(bad.Remedy, "enable_experimental_restore_via_create = true") {
		t.Fatalf("links %s: %+v", statuses(r), bad)
	}
	pods, _ := w.Client.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kubectl-migrate-check"})
	if len(pods.Items) != 0 {
		t.Fatalf("a canary was created: %v", pods.Items)
	}
}

func TestRemedies(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{agentRemedy(errors.New(`pods "x" is forbidden: violates PodSecurity "baseline:latest": hostPath volumes`), "kubectl-migrate-system"), "kubectl label namespace kubectl-migrate-system pod-security.kubernetes.io/enforce=privileged"},
		{agentRemedy(errors.New("ErrImagePull"), "apps"), "--agent-image"},
	} {
		if !strings.Contains(tc.got, tc.want) {
			t.Errorf("remedy %q does not name %q", tc.got, tc.want)
		}
	}
}

// TestUnreachableAPIServerNamesNoLeftovers: a check that could not reach the
// API server started nothing, and its cleanup says so instead of naming
// agent pods to remove by hand.
func TestUnreachableAPIServerNamesNoLeftovers(t *testing.T) {
	w := migratetest.NewWorld(t)
	w.Client.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New(`Get "https://10.0.0.1:6443/api": dial tcp 10.0.0.1:6443: connect: connection refused`)
	})
	r := Run(context.Background(), testConfig(), w.Deps(), Hooks{})
	cleanup := r.Links[len(r.Links)-1]
	if cleanup.Name != LinkCleanup || cleanup.Status != OK || strings.Contains(cleanup.Detail+cleanup.Remedy, "agent pods") || !strings.Contains(cleanup.Detail, "created nothing") {
		t.Fatalf("cleanup link after an unreachable API server: %+v", cleanup)
	}
}
