//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
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
	concurrent(t)
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
	if !strings.Contains(strings.Join(writes, "\n"), "create /api/v1/namespaces/kubectl-migrate-system/secrets") {
		t.Fatalf("--dry-run=server requested no agent the audit log shows: %v", writes)
	}
	if st := state(t, w, "consumer"); st.Mode != protocol.ModePrimary {
		t.Fatalf("the source does not serve: %+v", st)
	}
}

// TestBrokerPasswordFromASecretOrTheEnvironment: with a broker URL whose
// password is wrong (one with none gets amqp's default, guest, the lab's),
// a migration's checks fail at the broker; the password from
// --broker-secret (a Secret of the pod's namespace) or from the
// environment, taking its place, lets them pass.
func TestBrokerPasswordFromASecretOrTheEnvironment(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deploy(t, "10")
	u, err := url.Parse(l.brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	password, _ := u.User.Password()
	u.User = url.UserPassword(u.User.Username(), "wrong")
	wrongPassword := u.String()
	dryRun := func(env []string, args ...string) (string, error) {
		cmd := l.kubectlCommand(l.migrateArgs(w, append([]string{"pod", "consumer", "--to", "node-b", "--dry-run=client", "--broker-url", wrongPassword}, args...)...)...)
		cmd.Env = append(cmd.Env, env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := dryRun(nil); exitCode(err) != 3 || !strings.Contains(out, "broker") || strings.Contains(out, "wrong") {
		t.Fatalf("with the wrong password: exit %d, want 3 naming the broker, not the password\n%s", exitCode(err), out)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rabbit-user"}, StringData: map[string]string{"username": u.User.Username(), "password": password}}
	if _, err := l.client.CoreV1().Secrets(w.Namespace).Create(context.Background(), secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := dryRun(nil, "--broker-secret", "rabbit-user"); err != nil {
		t.Fatalf("with --broker-secret: %v\n%s", err, out)
	}
	if out, err := dryRun([]string{"KUBECTL_MIGRATE_BROKER_PASSWORD=" + password}); err != nil {
		t.Fatalf("with KUBECTL_MIGRATE_BROKER_PASSWORD: %v\n%s", err, out)
	}
}

// TestReportWatchFollowsALiveMigration: kubectl migrate report -w, started
// while a migration runs in another process, prints its phases as they end
// and its breakdown once it has succeeded.
func TestReportWatchFollowsALiveMigration(t *testing.T) {
	concurrent(t)
	l := setup(t)
	w := l.deploy(t, "10")
	waitApplied(t, w, "consumer", 20)
	migration := l.kubectlCommand(l.migrateArgs(w, "pod", "consumer", "--to", "node-b", "-q")...)
	var migrationOut strings.Builder
	migration.Stdout, migration.Stderr = &migrationOut, &migrationOut
	if err := migration.Start(); err != nil {
		t.Fatal(err)
	}
	var id string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		records, err := (report.Store{Client: l.client}).List(ctx, w.Namespace)
		if err == nil && len(records) == 1 {
			id = records[0].ID
		}
		return id != "", nil
	})
	if err != nil {
		t.Fatalf("no record of the migration appeared: %v", err)
	}
	followed, followErr := l.kubectlCommand("migrate", "-n", w.Namespace, "report", id, "-w").CombinedOutput()
	if err := migration.Wait(); err != nil {
		t.Fatalf("the migration: %v\n%s", err, migrationOut.String())
	}
	if followErr != nil || !strings.Contains(string(followed), "✓ replay") || !strings.Contains(string(followed), "✓ cleanup") || !strings.Contains(string(followed), "Migration "+id+" succeeded") {
		t.Fatalf("report -w %s: %v\n%s", id, followErr, followed)
	}
	t.Logf("report -w %s:\n%s", id, followed)
	rec, err := (report.Store{Client: l.client}).Get(context.Background(), w.Namespace, id)
	if err != nil {
		t.Fatal(err)
	}
	checkConservation(t, w, rec.TargetPod)
}
