//go:build e2e

package e2e

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// exitCode is the exit status of a command run through kubectl (which execs
// the plugin, so its status is the plugin's).
func exitCode(err error) int {
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestExitCodesThroughTheRealBinary runs kubectl migrate through kubectl
// into each state the README's exit-code table names and checks the code,
// and that what the code promises holds: nothing changed, the source
// serves, or a journal is left that recover ends. Check's ✗ (6) is
// TestCheckUnpullableAgentImage's.
func TestExitCodesThroughTheRealBinary(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 20)
	pods := func() []string { return l.podPlaces(t, w.Namespace) }
	before := pods()
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"done: a dry run whose checks pass", []string{"pod", "consumer", "--to", "node-b", "--dry-run"}, 0},
		{"other failure: the API server is not there", []string{"pod", "consumer", "--to", "node-b", "--server", "https://127.0.0.1:1"}, 1},
		{"usage: no pod", []string{"pod", "--to", "node-b"}, 2},
		{"usage: an unknown strategy", []string{"pod", "consumer", "--to", "node-b", "--strategy", "teleport"}, 2},
		{"refused: the pod is already there", []string{"pod", "consumer", "--to", "node-a"}, 3},
		{"refused: no such node", []string{"pod", "consumer", "--to", "node-z"}, 3},
		{"rolled back: replay cannot finish in 1 ms", []string{"pod", "consumer", "--to", "node-b", "--replay-timeout", "1ms"}, 4},
	} {
		rec, stderr, err := l.migrate(t, w, tc.args...)
		if code := exitCode(err); code != tc.want {
			t.Fatalf("%s: exit %d, want %d\n%s", tc.name, code, tc.want, stderr)
		}
		// One line that starts "error:": the text of what failed may say
		// "error:" itself (client-go's rate limiter does).
		errorLines := 0
		for _, line := range strings.Split(stderr, "\n") {
			if strings.HasPrefix(line, "error:") {
				errorLines++
			}
		}
		if tc.want != 0 && errorLines != 1 {
			t.Errorf("%s: want one error line:\n%s", tc.name, stderr)
		}
		if tc.want == 4 && rec.Outcome != report.RolledBack {
			t.Fatalf("%s: outcome %s", tc.name, rec.Outcome)
		}
		if now := pods(); !slices.Equal(now, before) {
			t.Fatalf("%s: pods %v, were %v", tc.name, now, before)
		}
		if st := state(t, w, "consumer"); st.Mode != protocol.ModePrimary || st.PendingRestore {
			t.Fatalf("%s: the source does not serve: %+v", tc.name, st)
		}
	}

	// 5: the journal is kept (--keep-on-failure); recover ends it.
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--replay-timeout", "1ms", "--keep-on-failure")
	if code := exitCode(err); code != 5 || rec.ID == "" || !strings.Contains(stderr, "kubectl migrate recover "+rec.ID) {
		t.Fatalf("kept on failure: exit %d, want 5 naming recover\n%s", code, stderr)
	}
	if got := l.recover(t, w, rec.ID); got.Outcome != report.RolledBack {
		t.Fatalf("recovered to %s", got.Outcome)
	}
	if now := pods(); !slices.Equal(now, before) {
		t.Fatalf("after recover: pods %v, were %v", now, before)
	}
	checkConservation(t, w, "consumer")
}
