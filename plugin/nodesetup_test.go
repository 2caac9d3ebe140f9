package plugin

import (
	"io"
	"strings"
	"testing"

	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
)

// node-setup restarts runtimes: it shows the plan and asks first. Without
// a terminal it needs --yes (or --dry-run) before it talks to the cluster;
// --dry-run and a "no" change nothing.
func TestNodeSetupShowsThePlanAndAsks(t *testing.T) {
	w := migratetest.NewWorld(t)
	noTerminal := execute(t, w, "node-setup", "--all")
	if ExitCode(noTerminal.err) != ExitUsage || !strings.Contains(noTerminal.err.Error(), "pass --yes to go ahead, or --dry-run to see the plan") || noTerminal.clientCalled != 0 {
		t.Fatalf("without a terminal or --yes: %v (client called %d times)", noTerminal.err, noTerminal.clientCalled)
	}

	w.Client.ClearActions()
	dry := execute(t, w, "node-setup", "--all", "--dry-run")
	if dry.err != nil || !strings.Contains(dry.out.String(), "node-setup will install the kubectl-migrate runtime on 2 node(s)") ||
		!strings.Contains(dry.out.String(), "node-b (cri-o://1.34.0): install /opt/kubectl-migrate") || !strings.Contains(dry.out.String(), "Nothing was changed") {
		t.Fatalf("--dry-run: %v\n%s", dry.err, dry.out)
	}
	onlyReads(t, w.Client.Actions())

	defer func(was func(io.Reader) bool) { stdinIsTerminal = was }(stdinIsTerminal)
	stdinIsTerminal = func(io.Reader) bool { return true }
	for _, answer := range []string{"n\n", "\n", ""} {
		w.Client.ClearActions()
		no := executeWithInput(t, w, answer, "node-setup", "node-a", "--uninstall")
		if ExitCode(no.err) != ExitRefused || !strings.Contains(no.errOut.String(), "remove the kubectl-migrate runtime from 1 node(s)") || !strings.Contains(no.errOut.String(), "Go ahead? [y/N]") {
			t.Fatalf("answered %q: %v\n%s", answer, no.err, no.errOut)
		}
		onlyReads(t, w.Client.Actions())
	}
}

// onlyReads fails t for any API call but a read.
func onlyReads(t *testing.T, actions []k8stesting.Action) {
	t.Helper()
	for _, a := range actions {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
			t.Errorf("changed the cluster: %s %s", v, a.GetResource().Resource)
		}
	}
}
