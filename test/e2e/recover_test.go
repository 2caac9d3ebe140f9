//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// start runs kubectl migrate in the background, as a user's terminal would.
func (l *lab) start(t *testing.T, w *workload.Workload, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	argv := append(l.migrateArgs(w, args...), "-v", "1")
	cmd := l.kubectlCommand(argv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, &out
}

// pluginPID is the kubectl-migrate process of cmd: kubectl itself, which
// execs the plugin, or its child.
func pluginPID(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	isPlugin := func(pid int) bool {
		comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		return err == nil && strings.HasPrefix(string(comm), "kubectl-migrat")
	}
	var pid int
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		if isPlugin(cmd.Process.Pid) {
			pid = cmd.Process.Pid
			return true, nil
		}
		children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		for _, f := range strings.Fields(string(children)) {
			if c, _ := strconv.Atoi(f); isPlugin(c) {
				pid = c
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal("no kubectl-migrate process for kubectl")
	}
	return pid
}

// onlyRecord returns the one record in the workload's namespace.
func (l *lab) onlyRecord(t *testing.T, w *workload.Workload) *report.Record {
	t.Helper()
	records, err := report.Store{Client: l.client}.List(context.Background(), w.Namespace)
	if err != nil || len(records) != 1 {
		t.Fatalf("want one record, have %d (%v)", len(records), err)
	}
	return records[0]
}

// recover runs kubectl migrate recover and returns its record.
func (l *lab) recover(t *testing.T, w *workload.Workload, id string, flags ...string) report.Record {
	t.Helper()
	out := l.kubectlMigrate(t, append([]string{"recover", id, "-n", w.Namespace, "--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab", "-o", "json"}, flags...)...)
	var rec report.Record
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &rec); err != nil {
		t.Fatalf("recover printed no record: %v\n%s", err, out)
	}
	t.Logf("recovered %s: %s", id, rec.Outcome)
	return rec
}

// noAgentsLeft checks that no migration recorded in namespace left an agent
// pod (in the agents' namespace), a puller (in namespace) or the agents'
// copy of a registry secret, and that no agent request acts for namespace.
func (l *lab) noAgentsLeft(t testing.TB, namespace string) {
	t.Helper()
	ctx := context.Background()
	records, err := report.Store{Client: l.client}.List(ctx, namespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range records {
		selector := metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=kubectl-migrate-agent," + migrate.MigrationLabel + "=" + r.ID}
		for _, ns := range []string{agent.DefaultNamespace, namespace} {
			if pods, _ := l.client.CoreV1().Pods(ns).List(ctx, selector); len(pods.Items) != 0 {
				t.Fatalf("migration %s left %d agent pods in %s, e.g. %s", r.ID, len(pods.Items), ns, pods.Items[0].Name)
			}
		}
		if secrets, _ := l.client.CoreV1().Secrets(agent.DefaultNamespace).List(ctx, selector); len(secrets.Items) != 0 {
			t.Fatalf("migration %s left the agents' copy of its registry secret", r.ID)
		}
	}
	// A migration refused before it journals has no record: its requests
	// are found by the namespace they act for.
	requests, err := l.client.CoreV1().Secrets(agent.DefaultNamespace).List(ctx, metav1.ListOptions{LabelSelector: agent.RequestNamespaceLabel + "=" + namespace})
	if err != nil {
		t.Fatal(err)
	}
	if len(requests.Items) != 0 {
		t.Fatalf("%d agent requests acting for %s left, e.g. %s", len(requests.Items), namespace, requests.Items[0].Name)
	}
}

// nothingLeft checks that no pod, queue, lease or archive of a migration is
// left in the workload's namespace and on the nodes.
func (l *lab) nothingLeft(t *testing.T, w *workload.Workload, extraPods ...string) {
	t.Helper()
	ctx := context.Background()
	l.noAgentsLeft(t, w.Namespace)
	for _, p := range extraPods {
		if _, err := l.client.CoreV1().Pods(w.Namespace).Get(ctx, p, metav1.GetOptions{}); !isNotFound(err) {
			t.Fatalf("pod %s left: %v", p, err)
		}
	}
	leases, _ := l.client.CoordinationV1().Leases(w.Namespace).List(ctx, metav1.ListOptions{})
	if len(leases.Items) != 0 {
		t.Fatalf("%d leases left, e.g. %s", len(leases.Items), leases.Items[0].Name)
	}
	l.queuesGone(t, protocol.ReplayQueueName(w.Queue), protocol.MigrationQueueName(w.Queue))
	for _, node := range []string{"node-a", "node-b"} {
		archives, _ := filepath.Glob(filepath.Join(env(t, "LAB_RUN"), node, "kubelet", "checkpoints", "*_"+w.Namespace+"-*"))
		if len(archives) != 0 {
			t.Fatalf("checkpoint archives left on %s: %v", node, archives)
		}
	}
}

// A crash case kills the plugin at one step, then recovers the migration.
type crashCase struct {
	name string
	args []string // after "pod consumer --to node-b" or "sts consumer-0 --to node-b"
	// killWhen, if set, SIGKILLs the plugin from outside once it holds;
	// otherwise args carry --inject-crash.
	killWhen func(ctx context.Context, l *lab, w *workload.Workload) bool
	want     report.Outcome
}

// What a crash matrix moves: a bare or Deployment pod with the MS2M
// contract, a StatefulSet's, or a pod without the contract.
type crashSubject int

const (
	contractPod crashSubject = iota
	contractStatefulSet
	withoutContract
	withoutContractStatefulSet
)

func (s crashSubject) statefulSet() bool {
	return s == contractStatefulSet || s == withoutContractStatefulSet
}

func (s crashSubject) contract() bool { return s == contractPod || s == contractStatefulSet }

// everyStep, with E2E_CRASH_MATRIX=all (make crash-matrix), or always,
// replaces a test's chosen crash cases by one for each phase of each
// strategy and mode that journals (all after preflight and setup) and can
// move the subject: the plugin killed as it starts.
func everyStep(chosen []crashCase, subject crashSubject, always ...bool) []crashCase {
	if !slices.Contains(strings.Split(os.Getenv("E2E_CRASH_MATRIX"), ","), "all") && len(always) == 0 {
		return chosen
	}
	var all []crashCase
	statefulSet := subject.statefulSet()
	modes := []migrate.StatefulSetMode{""}
	if statefulSet {
		modes = migrate.Modes
	}
	for _, mode := range modes {
		for _, strategy := range migrate.Strategies {
			if mode == migrate.Shadow && strategy != migrate.MS2M || strategy.Contract() != subject.contract() {
				continue // shadow mode is MS2M's; checkpoint-restore moves only what lacks the contract
			}
			committed := false // a switchover (of the final stage) commits
			for _, p := range migrate.Phases(strategy, statefulSet, mode) {
				stage := ""
				if s, ok := p.(interface{ Stage() string }); ok {
					stage = s.Stage()
				}
				want := report.RolledBack
				if committed {
					want = report.Succeeded
				}
				committed = committed || p.Name() == report.Switchover && stage != "shadow"
				if !migrate.Recoverable(p) {
					continue // preflight and setup leave nothing to recover
				}
				step := string(p.Name())
				if stage != "" {
					step += "/" + stage
				}
				args := []string{"--strategy", string(strategy), "--inject-crash", step}
				if statefulSet {
					args = append(args, "--mode", string(mode))
				}
				all = append(all, crashCase{name: strings.Trim(string(mode)+"/"+string(strategy), "/") + "/" + step, args: args, want: want})
			}
		}
	}
	return all
}

func TestRecoverPodAfterCrash(t *testing.T) {
	concurrent(t)
	for _, tc := range everyStep([]crashCase{
		{name: "ms2m/restore", args: []string{"--inject-crash", "restore"}, want: report.RolledBack},
		{name: "ms2m/cleanup", args: []string{"--inject-crash", "cleanup"}, want: report.Succeeded},
		{name: "stop-and-copy/image", args: []string{"--strategy", "stop-and-copy", "--inject-crash", "image"}, want: report.RolledBack},
	}, contractPod) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each case has a namespace, queues and records of its own
			setup(t).recoverPodAfterCrash(t, tc)
		})
	}
}

// recoverPodAfterCrash deploys the workload, crashes tc's migration of the
// consumer, recovers it and checks the outcome, conservation and that
// nothing is left.
func (l *lab) recoverPodAfterCrash(t *testing.T, tc crashCase) {
	l.recoverPodAfterCrashWith(t, tc, workload.Options{Rate: "10"})
}

// recoverPodAfterCrashWith is recoverPodAfterCrash of the workload o.
func (l *lab) recoverPodAfterCrashWith(t *testing.T, tc crashCase, o workload.Options) {
	w := l.deployWith(t, o)
	before := waitApplied(t, w, "consumer", 20)
	rec := l.crashAndRecover(t, w, tc, "pod", "consumer")
	consumer := "consumer"
	if rec.Outcome == report.Succeeded {
		l.checkMigrated(t, w, rec, before)
		consumer = rec.TargetPod
	} else if st := state(t, w, "consumer"); st.Process != before.Process || st.Mode != protocol.ModePrimary {
		t.Fatalf("the source does not serve after recovery: %+v", st)
	}
	checkConservation(t, w, consumer)
	l.nothingLeft(t, w)
}

func TestRecoverStatefulSetAfterCrash(t *testing.T) {
	concurrent(t)
	stsGone := func(ctx context.Context, l *lab, w *workload.Workload) bool {
		_, err := l.client.AppsV1().StatefulSets(w.Namespace).Get(ctx, "consumer", metav1.GetOptions{})
		return isNotFound(err)
	}
	for _, tc := range everyStep([]crashCase{
		{name: "sequential/statefulset-deleted", killWhen: stsGone, want: report.RolledBack},
		{name: "sequential/restore", args: []string{"--inject-crash", "restore"}, want: report.RolledBack},
		// Killed as the switchover starts, the copy has replayed (and the
		// replay queue acknowledged) what the source applied after its
		// checkpoint: its state must move back.
		{name: "sequential/replayed", args: []string{"--inject-crash", "switchover"}, want: report.RolledBack},
		{name: "stop-and-copy/adopt", args: []string{"--strategy", "stop-and-copy", "--inject-crash", "adopt"}, want: report.RolledBack},
		{name: "shadow/detach-final", args: []string{"--mode", "shadow", "--inject-crash", "detach/final"}, want: report.RolledBack},
		{name: "shadow/cleanup-final", args: []string{"--mode", "shadow", "--inject-crash", "cleanup/final"}, want: report.Succeeded},
	}, contractStatefulSet) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			setup(t).recoverStatefulSetAfterCrash(t, tc)
		})
	}
}

// recoverStatefulSetAfterCrash runs a live StatefulSet, crashes tc's
// migration of consumer-0, recovers it and checks where consumer-0 serves,
// conservation and that nothing is left; it returns the recovered record.
func (l *lab) recoverStatefulSetAfterCrash(t *testing.T, tc crashCase) report.Record {
	b := l.startStatefulSet(t, 20)
	rec := l.crashAndRecover(t, b.w, tc, "sts", "consumer-0", "--queue", b.w.Queue)
	node := "node-a"
	if rec.Outcome == report.Succeeded {
		node = "node-b"
	}
	if _, st := l.checkStatefulSetAfter(t, b, node); st.Mode != protocol.ModePrimary {
		t.Fatalf("consumer-0 does not consume its queue after recovery: %+v", st)
	}
	checkConservation(t, b.w, "consumer-0")
	l.nothingLeft(t, b.w, "consumer-0-shadow")
	return rec
}

// crashAndRecover runs the migration of tc, kills it, checks that the next
// migration of the pod is pointed at recovery and that report lists it as
// interrupted, recovers it and returns the recovered record.
func (l *lab) crashAndRecover(t *testing.T, w *workload.Workload, tc crashCase, cmd string, args ...string) report.Record {
	t.Helper()
	ctx := context.Background()
	run, out := l.start(t, w, append(append([]string{cmd}, args[0], "--to", "node-b"), append(args[1:], tc.args...)...)...)
	if tc.killWhen != nil {
		pid := pluginPID(t, run)
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			return tc.killWhen(ctx, l, w), nil
		}); err != nil {
			t.Fatalf("the moment to kill never came: %v\n%s", err, out)
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	err := run.Wait()
	t.Logf("killed migration (%v):\n%s", err, out)
	if err == nil {
		t.Fatal("the migration was not killed")
	}
	rec := l.onlyRecord(t, w)
	if rec.Outcome != report.Running {
		t.Fatalf("the killed migration's record says %s", rec.Outcome)
	}
	list := l.kubectlMigrate(t, "report", "-n", w.Namespace)
	if !strings.Contains(list, "interrupted") || !strings.Contains(list, "kubectl migrate recover "+rec.ID) {
		t.Fatalf("report does not show the interrupted migration:\n%s", list)
	}
	_, stderr, err := l.migrate(t, w, append([]string{cmd, args[0], "--to", "node-b"}, args[1:]...)...)
	if err == nil || !strings.Contains(stderr, "kubectl migrate recover "+rec.ID) {
		t.Fatalf("a new migration was not pointed at recovery: %v\n%s", err, stderr)
	}
	// The journal keeps no broker password; where no live pod of the
	// migration has it in its annotation (a StatefulSet pod between its
	// source's deletion and its target's creation) recovery asks for it.
	got := l.recover(t, w, rec.ID, "--broker-url", l.brokerURL)
	if got.Outcome != tc.want {
		t.Fatalf("recovered to %s, want %s: %s", got.Outcome, tc.want, got.Error)
	}
	if again := l.kubectlMigrate(t, "recover", rec.ID, "-n", w.Namespace, "--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab"); !strings.Contains(again, "nothing to recover") {
		t.Fatalf("a second recovery: %s", again)
	}
	return got
}
