//go:build e2e

// Package e2e proves kubectl-migrate on the lab cluster (test/lab): real
// kubelets, CRI-O, runc and CRIU, a real registry and RabbitMQ. It drives the
// built kubectl-migrate binary through the real kubectl.
//
//	go run ./test/lab up && eval "$(go run ./test/lab env)" && go test -tags e2e ./test/e2e
package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/broker"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/testenv"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// lab is what the tests need to know about the running lab.
type lab struct {
	kubectl, imagePrefix, registry, brokerURL string
	client                                    kubernetes.Interface
	config                                    *rest.Config
	pluginDir                                 string
}

func env(t testing.TB, key string) string {
	return testenv.Require(t, key, `go run ./test/lab up && eval "$(go run ./test/lab env)"`)
}

// setup is what every test calls first: the lab, and the container
// runtime's own restore where the lane has one.
func setup(t testing.TB) *lab {
	t.Helper()
	l := newLab(t)
	if criRestores() {
		// A runtime an earlier test kept would restore this test's moves
		// (--restore auto): it needs the container runtime's own restore.
		dropRuntime(t)
	}
	return l
}

// setupUnderRuntime is setup for a test that needs the kubectl-migrate
// runtime installed on both nodes until it ends.
func setupUnderRuntime(t testing.TB) *lab {
	t.Helper()
	l := newLab(t)
	l.useRuntime(t)
	return l
}

// newLab reads the lab's environment and installs the agents' controller
// once per test process.
func newLab(t testing.TB) *lab {
	l := &lab{
		kubectl: env(t, "LAB_KUBECTL"), imagePrefix: env(t, "LAB_IMAGE_PREFIX"),
		registry: env(t, "LAB_REGISTRY"), brokerURL: env(t, "LAB_BROKER_URL"),
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", env(t, "KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	if l.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	l.config = cfg
	if l.pluginDir, err = buildPlugin(); err != nil {
		t.Fatal(err)
	}
	agentsController.once.Do(func() {
		out, err := l.kubectlCommand("migrate", "node-setup", "--agents-only", "--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab").CombinedOutput()
		if err != nil {
			agentsController.err = fmt.Errorf("install the agents' controller: %v\n%s", err, out)
		}
	})
	if agentsController.err != nil {
		t.Fatal(agentsController.err)
	}
	return l
}

// agentsController is installed once per test process, as an
// administrator installs it once per cluster: every migration asks it for
// its agents.
var agentsController struct {
	once sync.Once
	err  error
}

// concurrent runs t beside the other concurrent tests and the crash
// matrix, -parallel at a time, after every test that does not call it. A
// test calls it when all it makes lives in namespaces of its own and all it
// checks is theirs; one that changes the lab for everyone (stops a daemon,
// cordons a node, runs node-setup, writes the agents' namespace, pushes the
// lab's images) or measures rates and times stays serial. Concurrent tests
// that need the kubectl-migrate runtime share one installation
// (restoresSomeWay); only serial tests install and uninstall it for
// themselves.
func concurrent(t *testing.T) {
	t.Parallel()
	if criRestores() {
		// The last serial test may have kept the runtime installed; the
		// first concurrent test removes it while the others wait here.
		dropRuntime(t)
	}
}

// plugin is the plugin the tests run, built once per test process: a
// build per test loaded the machine the benchmarks measure on.
var plugin struct {
	once sync.Once
	dir  string
	err  error
}

// buildPlugin builds the plugin into a directory of its own, once; TestMain
// removes it.
func buildPlugin() (string, error) {
	plugin.once.Do(func() {
		if plugin.dir, plugin.err = os.MkdirTemp("", "kubectl-migrate-e2e-"); plugin.err != nil {
			return
		}
		build := exec.Command("go", "build", "-o", filepath.Join(plugin.dir, "kubectl-migrate"), "github.com/kubectl-migrate/kubectl-migrate/cmd/kubectl-migrate")
		if out, err := build.CombinedOutput(); err != nil {
			plugin.err = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	return plugin.dir, plugin.err
}

func TestMain(m *testing.M) {
	code := m.Run()
	if !dropRuntimeAtExit() {
		code = 1
	}
	if plugin.dir != "" {
		_ = os.RemoveAll(plugin.dir)
	}
	os.Exit(code)
}

// deploy starts the sample workload on node-a in a namespace of its own,
// removed when the test ends.
func (l *lab) deploy(t testing.TB, rate string) *workload.Workload {
	return l.deployWith(t, workload.Options{Rate: rate})
}

// deployWith deploys the workload on node-a with o's rate, ballast and work
// per message (default 50 ms), the lab's images, broker and registry.
func (l *lab) deployWith(t testing.TB, o workload.Options) *workload.Workload {
	o.Node, o.ImagePrefix, o.BrokerURL, o.Registry, o.Work = "node-a", l.imagePrefix, l.brokerURL, l.registry, cmp.Or(o.Work, "50ms")
	w, err := workload.Deploy(context.Background(), l.client, o)
	if w != nil {
		t.Cleanup(func() {
			if t.Failed() {
				l.dumpDiagnostics(t, w)
			}
			_ = w.Delete(context.Background())
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func waitApplied(t testing.TB, w *workload.Workload, pod string, seq uint64) protocol.State {
	t.Helper()
	st, err := w.WaitApplied(context.Background(), pod, seq, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func state(t testing.TB, w *workload.Workload, pod string) protocol.State {
	t.Helper()
	st, err := w.State(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// kubectlCommand is the real kubectl with the built plugin on its PATH,
// colour off and the experimental features on (the lab proves them too).
func (l *lab) kubectlCommand(argv ...string) *exec.Cmd {
	cmd := exec.Command(l.kubectl, argv...)
	cmd.Env = append(os.Environ(), "PATH="+l.pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"), "NO_COLOR=1", "KUBECTL_MIGRATE_EXPERIMENTAL=lazy-pages")
	return cmd
}

// migrate runs kubectl migrate through the real kubectl plugin mechanism.
func (l *lab) migrate(t testing.TB, w *workload.Workload, args ...string) (report.Record, string, error) {
	t.Helper()
	argv := l.migrateArgs(w, args...)
	cmd := l.kubectlCommand(argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	err := cmd.Run()
	// A benchmark's log is truncated: keep it for the summary (failures
	// carry stderr anyway).
	if _, bench := t.(*testing.B); !bench {
		t.Logf("kubectl %s (%s):\n%s", strings.Join(argv, " "), time.Since(t0).Round(time.Millisecond), stderr.String())
	}
	var rec report.Record
	if jerr := json.Unmarshal(stdout.Bytes(), &rec); jerr != nil && err == nil {
		t.Fatalf("not a record: %v\n%s", jerr, stdout.String())
	}
	return rec, stderr.String(), err
}

// migrateArgs is kubectl's argv for kubectl migrate CMD ARGS with the lab's
// agent image and registry; flags in args come later and so win.
func (l *lab) migrateArgs(w *workload.Workload, args ...string) []string {
	argv := []string{"migrate", "-n", w.Namespace, args[0], "--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab", "--insecure-registry", "-o", "json"}
	if slices.Contains([]string{"pod", "sts", "node"}, args[0]) {
		// The lab's registry takes anonymous pulls (TestTenantAnonymousCheckpointsAreRefused
		// shows the refusal without this).
		argv = append(argv, "--allow-anonymous-checkpoints")
	}
	return append(argv, args[1:]...)
}

// kubectlMigrate runs another kubectl migrate command and returns its output.
func (l *lab) kubectlMigrate(t testing.TB, args ...string) string {
	t.Helper()
	cmd := l.kubectlCommand(append([]string{"migrate"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl migrate %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func (l *lab) replayQueueGone(t testing.TB, w *workload.Workload) {
	t.Helper()
	l.queuesGone(t, protocol.ReplayQueueName(w.Queue))
}

// queuesGone checks that the broker has none of the queues.
func (l *lab) queuesGone(t testing.TB, queues ...string) {
	t.Helper()
	b, err := broker.Dial(context.Background(), l.brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, q := range queues {
		if _, err := b.QueueDepth(context.Background(), q); !broker.IsNotFound(err) {
			t.Fatalf("queue %s still there (%v)", q, err)
		}
	}
}

// dumpDiagnostics logs what a failed test's namespace went through, the
// most telling last (CI shows a failure's tail): its events in time order,
// what the nodes' kubelets and runtimes said of its pods, then each pod's
// containers and the tails of their logs, the previous instance's too.
func (l *lab) dumpDiagnostics(t testing.TB, w *workload.Workload) {
	ctx := context.Background()
	events, _ := l.client.CoreV1().Events(w.Namespace).List(ctx, metav1.ListOptions{})
	slices.SortStableFunc(events.Items, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	for _, e := range lastN(events.Items, 30) {
		t.Logf("event %s %s %s: %s", e.LastTimestamp.Format("15:04:05"), e.InvolvedObject.Name, e.Reason, e.Message)
	}
	pods, _ := l.client.CoreV1().Pods(w.Namespace).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Name, "producer") {
			continue
		}
		for _, line := range lastN(nodeLogLines(p), 12) {
			t.Logf("%s", line)
		}
	}
	for _, p := range pods.Items {
		t.Logf("pod %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, c := range p.Status.ContainerStatuses {
			t.Logf("  container %s ready=%t restarts=%d state=%s last=%s", c.Name, c.Ready, c.RestartCount, containerState(c.State), containerState(c.LastTerminationState))
			if strings.HasPrefix(p.Name, "producer") {
				continue
			}
			for _, previous := range []bool{true, false} {
				if previous && c.LastTerminationState.Terminated == nil {
					continue
				}
				logs, err := l.client.CoreV1().Pods(w.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, Previous: previous, TailLines: ptr.To[int64](15)}).DoRaw(ctx)
				if err == nil {
					t.Logf("  logs of %s (previous=%t):\n%s", c.Name, previous, logs)
				}
			}
		}
	}
}

// containerState says in a few words what a container state holds.
func containerState(s corev1.ContainerState) string {
	switch {
	case s.Waiting != nil:
		return "waiting " + s.Waiting.Reason + " " + s.Waiting.Message
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.Format("15:04:05")
	case s.Terminated != nil:
		return fmt.Sprintf("terminated %s exit %d at %s %s", s.Terminated.Reason, s.Terminated.ExitCode, s.Terminated.FinishedAt.Format("15:04:05"), s.Terminated.Message)
	}
	return "none"
}

// nodeLogLines are the warnings, errors and restores in the lab's logs of
// p's node (kubelet and runtime) that name p.
func nodeLogLines(p corev1.Pod) []string {
	run := os.Getenv("LAB_RUN")
	if run == "" || p.Spec.NodeName == "" {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(run, "logs", p.Spec.NodeName+"-*.log"))
	var lines []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			names := strings.Contains(line, string(p.UID)) || strings.Contains(line, p.Namespace+"/"+p.Name)
			telling := strings.HasPrefix(line, "E") || strings.HasPrefix(line, "W") || strings.Contains(line, "level=error") ||
				strings.Contains(line, "level=warn") || strings.Contains(line, "estor")
			if names && telling {
				line = strings.TrimSpace(line)
				if len(line) > 400 {
					line = line[:400] + "…"
				}
				lines = append(lines, filepath.Base(f)+": "+line)
			}
		}
	}
	return lines
}

// lastN is the last n of s.
func lastN[T any](s []T, n int) []T { return s[max(0, len(s)-n):] }

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// namespaces creates namespaces of the test's own, deleted when it ends.
func (l *lab) namespaces(t testing.TB, names ...string) {
	t.Helper()
	for _, ns := range names {
		if _, err := l.client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
}

// waitDefaultServiceAccount waits until namespace's default service account
// exists: it appears a moment after the namespace, and pods are refused
// until it does.
func (l *lab) waitDefaultServiceAccount(t testing.TB, namespace string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := l.client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("namespace %s has no default service account: %v", namespace, err)
	}
}

// podPlaces lists namespace's pods as NAME@NODE, sorted: what a refused or
// undone command must leave as it was.
func (l *lab) podPlaces(t *testing.T, namespace string) []string {
	t.Helper()
	list, err := l.client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var places []string
	for _, p := range list.Items {
		places = append(places, p.Name+"@"+p.Spec.NodeName)
	}
	slices.Sort(places)
	return places
}
