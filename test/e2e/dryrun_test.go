//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

// auditEvent is what the tests read of the lab's audit log (the API
// server's, which has every write but the nodes' and the control plane's).
type auditEvent struct {
	Verb             string `json:"verb"`
	RequestURI       string `json:"requestURI"`
	ImpersonatedUser *struct {
		Username string `json:"username"`
	} `json:"impersonatedUser"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
}

// writesBy lists the API calls user made (impersonated) that the audit log
// has: every one but reads.
func writesBy(t *testing.T, user string) (writes []string, reviews int) {
	t.Helper()
	f, err := os.Open(filepath.Join(env(t, "LAB_RUN"), "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e auditEvent
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.ImpersonatedUser == nil || e.ImpersonatedUser.Username != user {
			continue
		}
		if e.ObjectRef != nil && strings.HasSuffix(e.ObjectRef.Resource, "accessreviews") {
			reviews++ // asking what the caller may do changes nothing
			continue
		}
		writes = append(writes, e.Verb+" "+e.RequestURI)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return writes, reviews
}

// TestClientDryRunOnlyReads: kubectl migrate pod --dry-run=client, run as
// a user of its own, makes no API call the audit log records but the access
// reviews of its permission check; --dry-run=server, as another, does (it
// starts the agents), which shows the audit sees such calls.
func TestClientDryRunOnlyReads(t *testing.T) {
	l := setup(t)
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 10)
	runAs := func(mode string) (writes []string, reviews int) {
		user := "dry-run-" + mode + "-" + rand.String(5)
		_, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--dry-run="+mode, "--as", user, "--as-group", "system:masters")
		if err != nil {
			t.Fatalf("--dry-run=%s: %v\n%s", mode, err, stderr)
		}
		return writesBy(t, user)
	}
	writes, reviews := runAs("client")
	if len(writes) > 0 || reviews == 0 {
		t.Fatalf("--dry-run=client: %d access reviews, and wrote %v", reviews, writes)
	}
	writes, _ = runAs("server")
	if !strings.Contains(strings.Join(writes, "\n"), "create /api/v1/namespaces/kubectl-migrate-system/pods") {
		t.Fatalf("--dry-run=server started no agent pod the audit log shows: %v", writes)
	}
	if st := state(t, w, "consumer"); st.Mode != ms2m.ModePrimary {
		t.Fatalf("the source does not serve: %+v", st)
	}
}
