package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

type run struct {
	out, errOut  *bytes.Buffer
	err          error
	clientCalled int
}

// execute runs the command tree against w, as kubectl would run the plugin.
func execute(t *testing.T, w *migratetest.World, args ...string) run {
	t.Helper()
	return executeWithInput(t, w, "", args...)
}

// executeWithInput is execute with stdin reading input.
func executeWithInput(t *testing.T, w *migratetest.World, input string, args ...string) run {
	t.Helper()
	streams, in, out, errOut := genericiooptions.NewTestIOStreams()
	in.WriteString(input)
	o := NewRootOptions(streams)
	o.Environ = nil
	r := run{out: out, errOut: errOut}
	o.NewClient = func() (kubernetes.Interface, error) {
		r.clientCalled++
		return w.Client, nil
	}
	o.NewDeps = func(context.Context, kubernetes.Interface, migrate.Config, []corev1.LocalObjectReference) (migrate.Deps, error) {
		return w.Deps(), nil
	}
	cmd := NewRootCmdFor(o)
	cmd.SetArgs(append([]string{"-n", "default"}, args...))
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	r.err = cmd.ExecuteContext(context.Background())
	return r
}

// The fake registry takes anonymous pulls, as a lab's may.
var brokerFlags = []string{"--registry", "reg:5000/ckpt", "--allow-anonymous-checkpoints", "--broker-url", "amqp://x", "--exchange", "ex", "--queue", "work"}

func TestBadInputTouchesNothing(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pod"}, "give the pod's name"},
		{[]string{"pod", "consumer"}, "--to NODE is required"},
		{[]string{"pod", "consumer", "--to", "node-b", "--strategy", "teleport"}, `--strategy must be one of [ms2m stop-and-copy checkpoint-restore], not "teleport"`},
		{[]string{"pod", "consumer", "--to", "node-b", "-o", "xml"}, "--output must be name, json, yaml, jsonpath=TEMPLATE or go-template=TEMPLATE"},
		{[]string{"pod", "consumer", "--to", "node-b", "--label", "novalue"}, `--label "novalue" is not key=value`},
		{[]string{"report", "-o", "table"}, "--output must be csv, name, json, yaml"},
		{[]string{"report", "a1b2c", "d3e4f"}, "give one migration ID, or --compare"},
		{[]string{"report", "--group-by", "rate"}, "--group-by applies to --compare"},
		{[]string{"report", "--compare", "-l", "rate in (10"}, "is not a label selector"},
		{[]string{"--color", "sometimes", "version"}, "--color must be auto, always or never"},
		{[]string{"pod", "consumer", "--to", "node-b", "--strategy", "stop-and-copy", "--pages", "lazy"}, "--pages lazy is experimental"},
		{[]string{"pod", "consumer", "--to", "node-b", "--pages", "lazier"}, `--pages must be one of [eager lazy], not "lazier"`},
		{[]string{"sts", "consumer-0", "--to", "node-b", "--mode", "parallel"}, `--mode must be one of [sequential shadow], not "parallel"`},
		{[]string{"sts", "consumer", "--to", "node-b"}, `"consumer" is not NAME-ORDINAL`},
		{[]string{"sts", "sts/consumer", "--to", "node-b"}, "give the pod's ordinal with --ordinal N"},
		{[]string{"sts", "consumer-0", "--to", "node-b", "--transfer", "direct"}, "--transfer direct is for bare pods"},
		{[]string{"check", "--to", "node-b"}, "give both nodes: kubectl migrate check --from NODE --to NODE"},
		{[]string{"check", "--from", "node-a", "--to", "node-a", "--registry", "r/c"}, "--from and --to are both node-a"},
		{[]string{"check", "--from", "node-a", "--to", "node-b", "--transfer", "registry"}, "--transfer registry needs --registry"},
		{[]string{"check", "--from", "node-a", "--to", "node-b", "--transfer", "pigeon"}, "--transfer must be one of [registry direct]"},
		{[]string{"check", "--from", "node-a", "--to", "node-b", "--registry", "r/c", "--transfer", "registry", "--restore", "runtime"}, "--restore runtime sends the checkpoint node to node"},
		{[]string{"check", "--from", "node-a", "--to", "node-b", "--registry", "r/c", "-o", "csv"}, "--output must be json, yaml, jsonpath=TEMPLATE or go-template=TEMPLATE"},
		{[]string{"conformance", "--image", "team/orders:1", "--broker-url", "amqp://b/", "-o", "csv"}, "--output must be json, yaml, jsonpath=TEMPLATE or go-template=TEMPLATE"},
		{[]string{"check", "node-a", "node-b"}, "takes no arguments"},
		{[]string{"pod", "consumer", "--to", "node-b", "--dry-run=maybe"}, `--dry-run must be none, client or server, not "maybe"`},
		{[]string{"pod", "consumer", "--to", "node-b", "--no-such-flag"}, "unknown flag: --no-such-flag (see 'kubectl migrate pod --help')"},
		{[]string{"node"}, "give the node to drain"},
		{[]string{"node", "node-a", "--to", "node-a"}, "--to node-a is the node being drained"},
		{[]string{"node", "node-a", "--to", "node-b", "--to-selector", "pool=x"}, "give --to or --to-selector, not both"},
		{[]string{"node", "node-a", "--parallel", "0"}, "--parallel must be at least 1"},
		{[]string{"node", "node-a", "--mode", "parallel"}, `--mode must be one of [sequential shadow], not "parallel"`},
		{[]string{"node", "node-a", "--to-selector", "pool in (x"}, "is not a label selector"},
		{[]string{"conformance", "--broker-url", "amqp://b/"}, "give --image"},
		{[]string{"conformance", "--image", "app:1"}, "give --broker-url"},
		{[]string{"conformance", "--image", "app:1", "--broker-url", "amqp://b/", "--to", "node-b"}, "give both --from and --to"},
		{[]string{"conformance", "--image", "app:1", "--broker-url", "amqp://b/", "--from", "node-a", "--to", "node-b"}, "give --registry"},
		{[]string{"conformance", "--image", "app:1", "--broker-url", "amqp://b/", "--port", "0"}, "--port must be a port number"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			w := migratetest.NewWorld(t)
			r := execute(t, w, tc.args...)
			if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", r.err, tc.want)
			}
			if strings.Contains(r.err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", r.err)
			}
			if code := ExitCode(r.err); code != ExitUsage {
				t.Fatalf("exit code %d, want %d (usage)", code, ExitUsage)
			}
			if r.clientCalled != 0 || len(w.Calls) != 0 {
				t.Fatal("bad input reached the cluster")
			}
		})
	}
}

func TestMissingSettingsNameTheFix(t *testing.T) {
	w := migratetest.NewWorld(t)
	r := execute(t, w, "pod", "consumer", "--to", "node-b") // no annotations, no flags
	if r.err == nil || !strings.Contains(r.err.Error(), "--registry is required") || !strings.Contains(r.err.Error(), "ms2m.io/") {
		t.Fatalf("got %v", r.err)
	}
	if len(w.Calls) != 0 {
		t.Fatal("changed something")
	}
	r = execute(t, w, "pod", "nope", "--to", "node-b")
	if r.err == nil || r.err.Error() != "pod nope not found in namespace default; check the name and -n" {
		t.Fatalf("got %v", r.err)
	}
}

func TestPodMigratesAndReports(t *testing.T) {
	w := migratetest.NewWorld(t)
	r := execute(t, w, append([]string{"pod", "consumer", "--to", "node-b", "--label", "rate=10"}, brokerFlags...)...)
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, r.errOut)
	}
	for _, phase := range []string{"✓ preflight", "✓ checkpoint", "✓ replay", "✓ switchover", "✓ cleanup"} {
		if !strings.Contains(r.errOut.String(), phase) {
			t.Errorf("stderr lacks %q:\n%s", phase, r.errOut)
		}
	}
	if !strings.Contains(r.out.String(), "succeeded") || !strings.Contains(r.out.String(), "total migration time") {
		t.Fatalf("stdout:\n%s", r.out)
	}
	saved := w.Records()
	if len(saved) != 1 || saved[0].Labels["rate"] != "10" {
		t.Fatal("record not saved with its labels")
	}
	// The record is in the cluster: report reads it back.
	if err := (report.Store{Client: w.Client}).Save(context.Background(), saved[0]); err != nil {
		t.Fatal(err)
	}
	list := execute(t, w, "report")
	if list.err != nil || !strings.Contains(strings.Join(strings.Fields(list.out.String()), " "), saved[0].ID+" ms2m consumer node-a node-b succeeded") {
		t.Fatalf("report list: %v\n%s", list.err, list.out)
	}
	detail := execute(t, w, "report", saved[0].ID, "-o", "json")
	var rec report.Record
	if err := json.Unmarshal(detail.out.Bytes(), &rec); err != nil || rec.ID != saved[0].ID || len(rec.Phases) != 9 {
		t.Fatalf("report -o json: %v %+v", err, rec)
	}
}

func TestPodDefaultsFromAnnotations(t *testing.T) {
	pod := migratetest.SourcePod()
	pod.Annotations = map[string]string{
		migrate.RegistryAnnotation: "reg:5000/ckpt", migrate.BrokerURLAnnotation: "amqp://x",
		migrate.ExchangeAnnotation: "ex", migrate.QueueAnnotation: "work", migrate.ControlPortAnnotation: "9090",
	}
	w := migratetest.NewWorld(t, []runtime.Object{migratetest.Node("node-a", "cri-o://1.34.0"), migratetest.Node("node-b", "cri-o://1.34.0"), pod}...)
	r := execute(t, w, "pod", "consumer", "--to", "node-b", "-o", "yaml", "-q", "--allow-anonymous-checkpoints")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.errOut.Len() != 0 {
		t.Fatalf("-q printed progress: %s", r.errOut)
	}
	if !strings.Contains(r.out.String(), "outcome: succeeded") || !strings.Contains(r.out.String(), "replayQueue: work.ms2m-replay") {
		t.Fatalf("yaml:\n%s", r.out)
	}
}

func TestDryRunPrintsPlanAndChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		world func(*testing.T) *migratetest.World
		args  []string
		want  []string
	}{
		{"pod", func(t *testing.T) *migratetest.World { return migratetest.NewWorld(t) }, []string{"pod", "consumer", "--to", "node-b"},
			[]string{"bind replay queue work.ms2m-replay", "restore pod consumer-"}},
		{"sts shadow", migratetest.NewStatefulSetWorld, []string{"sts", "sts/consumer", "--ordinal", "0", "--to", "node-b", "--mode", "shadow"},
			[]string{"(ms2m, shadow mode", "restore shadow pod consumer-0-shadow on node-b", "delete statefulset consumer orphaning its pods"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.world(t)
			r := execute(t, w, append(append(tc.args, "--dry-run"), brokerFlags...)...)
			if r.err != nil {
				t.Fatal(r.err)
			}
			out := r.out.String()
			for _, want := range append(tc.want, "Preflight passed", "Nothing was changed.", "kubectl migrate check --from node-a --to node-b") {
				if !strings.Contains(out, want) {
					t.Errorf("plan lacks %q:\n%s", want, out)
				}
			}
			// Nothing stays: no change, record or lease.
			if len(w.Changes()) != 0 || len(w.Records()) != 0 || len(w.Leases()) != 0 {
				t.Fatalf("dry run changed: %v", w.Calls)
			}
		})
	}
}

// TestClientDryRunOnlyReads: --dry-run=client makes no API call but reads
// (and the access reviews that ask what the caller may do), starts no
// agent and binds no probe; it still prints the plan.
func TestClientDryRunOnlyReads(t *testing.T) {
	w := migratetest.NewWorld(t)
	w.Client.ClearActions()
	r := execute(t, w, append([]string{"pod", "consumer", "--to", "node-b", "--dry-run=client"}, brokerFlags...)...)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if out := r.out.String(); !strings.Contains(out, "Preflight passed") || !strings.Contains(out, "restore pod consumer-") {
		t.Fatalf("no plan:\n%s", out)
	}
	reads := 0
	for _, a := range w.Client.Actions() {
		switch {
		case a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch":
			reads++
		case a.GetVerb() == "create" && strings.HasSuffix(a.GetResource().Resource, "accessreviews"):
		default:
			t.Errorf("a client dry run called %s %s/%s", a.GetVerb(), a.GetResource().Resource, a.GetSubresource())
		}
	}
	if reads == 0 {
		t.Fatal("no API call recorded: the test sees nothing")
	}
	for _, call := range w.Calls {
		if strings.HasPrefix(call, "agent") || strings.Contains(call, "probe") {
			t.Errorf("a client dry run did %q", call)
		}
	}
}

func TestFailedMigrationExitsWithTheCause(t *testing.T) {
	w := migratetest.NewWorld(t)
	w.FailAt = report.Checkpoint
	r := execute(t, w, append([]string{"pod", "consumer", "--to", "node-b"}, brokerFlags...)...)
	if r.err == nil || !strings.HasPrefix(r.err.Error(), "checkpoint: injected failure") {
		t.Fatalf("got %v", r.err)
	}
	if !strings.Contains(r.errOut.String(), "rolling back") || !strings.Contains(r.out.String(), "rolled-back") {
		t.Fatalf("stderr:\n%s\nstdout:\n%s", r.errOut, r.out)
	}
}

// TestExitCodesTellWhatIsLeft: a script tells a refusal, a rollback and a
// migration left to recover apart by the exit status alone.
func TestExitCodesTellWhatIsLeft(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  report.PhaseName
		extra []string
		want  int
	}{
		{"refused in preflight", report.Preflight, nil, ExitRefused},
		{"refused in setup", report.Setup, nil, ExitRefused},
		{"rolled back", report.Checkpoint, nil, ExitRolledBack},
		{"kept for recovery", report.Checkpoint, []string{"--keep-on-failure"}, ExitRecover},
		{"committed, cleanup unfinished", report.Cleanup, nil, ExitRecover},
		{"dry run refused", report.Preflight, []string{"--dry-run=server"}, ExitRefused},
		{"done", "", nil, 0},
		{"dry run", "", []string{"--dry-run"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := migratetest.NewWorld(t)
			w.FailAt = tc.fail
			args := append(append([]string{"pod", "consumer", "--to", "node-b"}, brokerFlags...), tc.extra...)
			err := execute(t, w, args...).err
			if got := ExitCode(err); got != tc.want {
				t.Fatalf("exit code %d, want %d", got, tc.want)
			}
			if tc.want == ExitRecover && !regexp.MustCompile(`kubectl migrate recover [a-z0-9]{5} -n default`).MatchString(err.Error()) {
				t.Fatalf("exit 5 without the command that ends it: %v", err)
			}
		})
	}
}

func TestCompletion(t *testing.T) {
	w := migratetest.NewWorld(t)
	pods := execute(t, w, "__complete", "pod", "")
	if pods.err != nil || !strings.Contains(pods.out.String(), "consumer\ton node-a") {
		t.Fatalf("pod completion: %v %q", pods.err, pods.out)
	}
	nodes := execute(t, w, "__complete", "pod", "consumer", "--to", "")
	if nodes.err != nil || !strings.Contains(nodes.out.String(), "node-a\nnode-b") {
		t.Fatalf("node completion: %v %q", nodes.err, nodes.out)
	}
}

func TestVersion(t *testing.T) {
	r := execute(t, migratetest.NewWorld(t), "version")
	if r.err != nil || !strings.HasPrefix(r.out.String(), "kubectl-migrate dev") {
		t.Fatalf("%v %q", r.err, r.out)
	}
}

func TestHelpReadsLikeKubectl(t *testing.T) {
	r := execute(t, migratetest.NewWorld(t), "pod", "--help")
	if r.err != nil || !strings.Contains(r.out.String(), "kubectl migrate pod NAME --to NODE") || !strings.Contains(r.out.String(), "Examples:") {
		t.Fatalf("%v\n%s", r.err, r.out)
	}
	// node refuses --queue and -c (each pod names its own): its help
	// does not offer them.
	r = execute(t, migratetest.NewWorld(t), "node", "--help")
	if r.err != nil || strings.Contains(r.out.String(), "--queue") || strings.Contains(r.out.String(), "--container") {
		t.Fatalf("node --help offers flags it refuses: %v\n%s", r.err, r.out)
	}
	// The two dozen global flags are behind kubectl migrate options, as
	// kubectl's are behind kubectl options.
	for _, args := range [][]string{{"--help"}, {"pod", "--help"}, {"report", "--help"}} {
		r = execute(t, migratetest.NewWorld(t), args...)
		if help := r.out.String(); r.err != nil || strings.Contains(help, "--kubeconfig string") || !strings.Contains(help, `Use "kubectl migrate options"`) {
			t.Fatalf("%v lists the global flags: %v\n%s", args, r.err, help)
		}
	}
	r = execute(t, migratetest.NewWorld(t), "options")
	if r.err != nil || !strings.Contains(r.out.String(), "--kubeconfig string") || !strings.Contains(r.out.String(), "-q, --quiet") {
		t.Fatalf("options: %v\n%s", r.err, r.out)
	}
}

// TestNoKubeconfigSaysSo: with no kubeconfig anywhere, the error names the
// cause, not client-go's fallback address.
func TestNoKubeconfigSaysSo(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	streams, _, _, _ := genericiooptions.NewTestIOStreams()
	cmd := NewRootCmd(streams)
	cmd.SetArgs([]string{"report"})
	err := cmd.ExecuteContext(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no kubeconfig found") || strings.Contains(err.Error(), "localhost:8080") {
		t.Fatalf("got %v", err)
	}
}

// TestReportListIsForScripts: the list is plain columns on stdout, the
// empty case and the recovery hints go to stderr naming the namespace.
func TestReportListIsForScripts(t *testing.T) {
	w := migratetest.NewWorld(t)
	empty := execute(t, w, "report")
	if empty.err != nil || empty.out.Len() != 0 || !strings.Contains(empty.errOut.String(), "No migrations recorded in namespace default") {
		t.Fatalf("empty list: %v\nstdout %q\nstderr %q", empty.err, empty.out, empty.errOut)
	}
	all := execute(t, w, "report", "-A")
	if !strings.Contains(all.errOut.String(), "in any namespace") {
		t.Fatalf("empty -A list: stderr %q", all.errOut)
	}
	rec := &report.Record{ID: "b3c4d", Strategy: "ms2m", Namespace: "default", Pod: "consumer", SourceNode: "node-a", TargetNode: "node-b", Outcome: report.Succeeded}
	if err := (report.Store{Client: w.Client}).Save(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	r := execute(t, w, "report", "-A", "--no-headers")
	if fields := strings.Fields(r.out.String()); r.err != nil || len(fields) != 10 || fields[0] != "default" || fields[1] != "b3c4d" {
		t.Fatalf("report -A --no-headers: %v\n%q", r.err, r.out)
	}
	if names := execute(t, w, "report", "-o", "name"); names.err != nil || names.out.String() != "migration/b3c4d\n" {
		t.Fatalf("report -o name: %v\n%q", names.err, names.out)
	}
}

// Scripting: a report with nothing in it is an empty list in JSON, the
// version is JSON on request, -o takes name, jsonpath= and go-template= as
// kubectl does (a template that does not parse is a usage error), and
// --help shows no default for a flag that has none (--ordinal).
func TestOutputForScripts(t *testing.T) {
	w := migratetest.NewWorld(t)
	r := execute(t, w, "report", "-o", "json")
	if r.err != nil || strings.TrimSpace(r.out.String()) != "[]" {
		t.Fatalf("report -o json with no migrations: %q, %v", r.out.String(), r.err)
	}
	v := execute(t, w, "version", "-o", "json")
	var info map[string]string
	if err := json.Unmarshal(v.out.Bytes(), &info); v.err != nil || err != nil || info["version"] == "" || info["agentImage"] == "" {
		t.Fatalf("version -o json: %q, %v %v", v.out.String(), v.err, err)
	}
	if bad := execute(t, w, "version", "-o", "table"); ExitCode(bad.err) != ExitUsage || !strings.Contains(bad.err.Error(), "--output must be json, yaml, jsonpath=TEMPLATE or go-template=TEMPLATE") {
		t.Fatalf("version -o table: %v", bad.err)
	}
	if v := execute(t, w, "version", "-o", "jsonpath={.version}"); v.err != nil || v.out.String() != "dev" {
		t.Fatalf("version -o jsonpath={.version}: %q, %v", v.out.String(), v.err)
	}
	if bad := execute(t, w, "version", "-o", "jsonpath={.version"); ExitCode(bad.err) != ExitUsage || !strings.Contains(bad.err.Error(), "unclosed action") {
		t.Fatalf("a jsonpath that does not parse: %v", bad.err)
	}
	// A migration's record: its name, one field, a template.
	for _, tc := range []struct{ format, want string }{
		{"name", "migration/"},
		{"jsonpath={.outcome}", "succeeded"},
		{"go-template={{.pod}} {{.targetNode}}", "consumer node-b"},
	} {
		r := execute(t, migratetest.NewWorld(t), append([]string{"pod", "consumer", "--to", "node-b", "-q", "-o", tc.format}, brokerFlags...)...)
		if r.err != nil || !strings.HasPrefix(r.out.String(), tc.want) {
			t.Fatalf("pod -o %s: %q, %v", tc.format, r.out.String(), r.err)
		}
	}
	// A dry run's -o name is the pod it would create.
	if r := execute(t, w, append([]string{"pod", "consumer", "--to", "node-b", "--dry-run", "-o", "name"}, brokerFlags...)...); r.err != nil || !regexp.MustCompile(`^pod/consumer-[a-z0-9]{5}\n$`).MatchString(r.out.String()) {
		t.Fatalf("dry run -o name: %q, %v", r.out.String(), r.err)
	}
	help := execute(t, w, "sts", "--help")
	if line := regexp.MustCompile(`.*--ordinal.*`).FindString(help.out.String()); line == "" || strings.Contains(line, "default") {
		t.Fatalf("--ordinal in --help: %q", line)
	}
}

// Ctrl-C says "rolling back" only where a migration runs that would.
func TestInterruptNoticeSaysRollingBackOnlyForAMigration(t *testing.T) {
	w := migratetest.NewWorld(t)
	streams, _, _, _ := genericiooptions.NewTestIOStreams()
	o := NewRootOptions(streams)
	if got := o.InterruptNotice(); got != "stopping" {
		t.Fatalf("before any migration: %q", got)
	}
	// A migration's run stores its recover hint as it starts.
	o.NewClient = func() (kubernetes.Interface, error) { return w.Client, nil }
	o.NewDeps = func(context.Context, kubernetes.Interface, migrate.Config, []corev1.LocalObjectReference) (migrate.Deps, error) {
		return w.Deps(), nil
	}
	cmd := NewRootCmdFor(o)
	cmd.SetArgs(append([]string{"-n", "default", "pod", "consumer", "--to", "node-b"}, brokerFlags...))
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	_ = cmd.ExecuteContext(context.Background())
	if got := o.InterruptNotice(); !strings.HasPrefix(got, "rolling back") {
		t.Fatalf("during a migration: %q", got)
	}
}

// An interrupted command exits 130, unless what it left has a code of its
// own: a migration's rollback (4) or its kept journal (5).
func TestExitCodeAfterAnInterrupt(t *testing.T) {
	for _, tc := range []struct {
		err         error
		interrupted bool
		want        int
	}{
		{context.Canceled, true, ExitInterrupted},
		{withCode(ExitCheckFailed, errCheckFailed), true, ExitInterrupted},
		{withCode(ExitRolledBack, errors.New("rolled back")), true, ExitRolledBack},
		{withCode(ExitRecover, errors.New("kept")), true, ExitRecover},
		{context.Canceled, false, ExitFailed},
		{nil, true, 0},
	} {
		if got := ExitCodeAfter(tc.err, tc.interrupted); got != tc.want {
			t.Errorf("ExitCodeAfter(%v, %v) = %d, want %d", tc.err, tc.interrupted, got, tc.want)
		}
	}
}

// report -w follows a running migration: a line per phase as its record
// says it ended, then the breakdown once the migration has.
func TestReportWatchFollowsAMigration(t *testing.T) {
	w := migratetest.NewWorld(t)
	store := report.Store{Client: w.Client}
	rec := &report.Record{ID: "f0110", Strategy: "ms2m", Namespace: "default", Pod: "consumer", SourceNode: "node-a", TargetNode: "node-b", Outcome: report.Running,
		StartedAt: time.Now(), Phases: []report.PhaseTiming{{Name: report.Preflight, DurationMillis: 40}, {Name: report.Setup, Running: true}}}
	if err := store.Save(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	// The migration's process holds its pod's lease while it runs.
	release, err := lease.Lock(context.Background(), w.Client, "default", "f0110", lease.Name("pod", "consumer"), "pod consumer", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer release(context.Background())
	go func() {
		// The migration goes on, saving its record as it does.
		time.Sleep(200 * time.Millisecond)
		rec.Phases[1] = report.PhaseTiming{Name: report.Setup, DurationMillis: 1500}
		rec.Phases = append(rec.Phases, report.PhaseTiming{Name: report.Checkpoint, DurationMillis: 300})
		_ = store.Save(context.Background(), rec)
		time.Sleep(200 * time.Millisecond)
		rec.Outcome = report.Succeeded
		_ = store.Save(context.Background(), rec)
	}()
	r := execute(t, w, "report", "f0110", "-w")
	if r.err != nil {
		t.Fatalf("%v\n%s", r.err, r.errOut)
	}
	progress := r.errOut.String()
	for _, want := range []string{"✓ preflight", "✓ setup 1.50s", "✓ checkpoint 300ms"} {
		if !strings.Contains(progress, want) {
			t.Errorf("progress lacks %q:\n%s", want, progress)
		}
	}
	if strings.Count(progress, "✓ preflight") != 1 {
		t.Errorf("a phase said twice:\n%s", progress)
	}
	if !strings.Contains(r.out.String(), "Migration f0110 succeeded") {
		t.Errorf("no breakdown at the end:\n%s", r.out)
	}
	if bad := execute(t, w, "report", "-w"); ExitCode(bad.err) != ExitUsage || !strings.Contains(bad.err.Error(), "--watch follows one migration") {
		t.Fatalf("report -w without an ID: %v", bad.err)
	}

	// One no process runs any more ends the watch at once, naming recover.
	release(context.Background())
	if err := store.Save(context.Background(), &report.Record{ID: "d0a0d", Strategy: "ms2m", Namespace: "default", Pod: "consumer", Outcome: report.Running, StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if dead := execute(t, w, "report", "d0a0d", "-w"); dead.err == nil || !strings.Contains(dead.err.Error(), "kubectl migrate recover d0a0d -n default") {
		t.Fatalf("report -w of a migration whose process died: %v", dead.err)
	}
}

// check --pods lists each pod with whether and how it would move and why
// not, as a table, as data, or, with -o name, the pods that can move.
func TestCheckPodsSaysWhatCanMove(t *testing.T) {
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "default"}, Spec: corev1.PodSpec{NodeName: "node-a"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	source := migratetest.SourcePod()
	source.Annotations = map[string]string{migrate.QueueAnnotation: "work"}
	member := plain.DeepCopy()
	member.Name = "cache-0"
	member.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "cache", UID: "cache", Controller: ptr.To(true)}}
	member.Spec.Containers = []corev1.Container{{Name: "cache", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}}}}
	w := migratetest.NewWorld(t, migratetest.Node("node-a", "cri-o://1.34.0"), migratetest.Node("node-b", "cri-o://1.34.0"), source, plain, member)
	w.Client.ClearActions()
	table := execute(t, w, "check", "--pods")
	out := table.out.String()
	if table.err != nil || !regexp.MustCompile(`consumer\s+node-a\s+yes\s+kubectl migrate pod consumer: MS2M`).MatchString(out) ||
		!regexp.MustCompile(`plain\s+node-a\s+yes\s+kubectl migrate pod plain: checkpoint/restore \(no MS2M contract\): .*connections are reset`).MatchString(out) ||
		!regexp.MustCompile(`cache-0\s+node-a\s+yes\s+kubectl migrate sts cache-0: checkpoint/restore \(no MS2M contract\), keeping its name`).MatchString(out) {
		t.Fatalf("check --pods: %v\n%s", table.err, out)
	}
	// The freeze each checkpoint/restore move's clients wait: bounded by
	// a memory limit where metrics.k8s.io does not tell (the fake serves
	// no metrics), unknown without either; none for MS2M.
	if !regexp.MustCompile(`cache-0 .*; freeze ≤ 5.8s for its memory limit of 512 MiB \(metrics.k8s.io does not tell what it uses\), at the lab's rate`).MatchString(out) ||
		!regexp.MustCompile(`plain .*; freeze unknown: neither metrics.k8s.io nor a memory limit`).MatchString(out) ||
		regexp.MustCompile(`consumer .*freeze`).MatchString(out) {
		t.Fatalf("check --pods does not predict the freezes:\n%s", out)
	}
	onlyReads(t, w.Client.Actions())
	if names := execute(t, w, "check", "--pods", "-o", "name"); names.out.String() != "pod/cache-0\npod/consumer\npod/plain\n" {
		t.Fatalf("check --pods -o name: %q", names.out)
	}
	data := execute(t, w, "check", "--pods", "--node", "node-b", "-o", "json")
	if data.err != nil || strings.TrimSpace(data.out.String()) != "[]" {
		t.Fatalf("check --pods on a node without pods, as JSON: %q %v", data.out, data.err)
	}
	if bad := execute(t, w, "check", "--pods", "--from", "node-a"); ExitCode(bad.err) != ExitUsage || !strings.Contains(bad.err.Error(), "give one or the other") {
		t.Fatalf("--pods with --from: %v", bad.err)
	}
}
