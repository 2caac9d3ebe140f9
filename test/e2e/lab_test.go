//go:build e2e

// Package e2e proves kubectl-migrate on the lab cluster (test/lab): real
// kubelets, CRI-O, runc and CRIU, a real registry and RabbitMQ. It drives the
// built kubectl-migrate binary through the real kubectl.
//
//	go run ./test/lab up && eval "$(go run ./test/lab env)" && go test -tags e2e ./test/e2e
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/broker"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// lab is what the tests need to know about the running lab.
type lab struct {
	kubectl, imagePrefix, registry, brokerURL string
	client                                    kubernetes.Interface
	app                                       appctl.Client
	pluginDir                                 string
}

func env(t *testing.T, key string) string {
	v := os.Getenv(key)
	if v == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not set: CI must bring the lab up (eval \"$(go run ./test/lab env)\")", key)
		}
		t.Skipf("%s not set; run: go run ./test/lab up && eval \"$(go run ./test/lab env)\"", key)
	}
	return v
}

func setup(t *testing.T) *lab {
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
	l.app = appctl.Client{REST: l.client.CoreV1().RESTClient()}
	l.pluginDir = t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(l.pluginDir, "kubectl-migrate"), "github.com/kubectl-migrate/kubectl-migrate/cmd/kubectl-migrate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return l
}

// workload is one producer/consumer pair in a namespace of its own, with
// queue names of its own, so runs never see each other's messages.
type workload struct {
	ns, exchange, queue string
}

func (l *lab) deploy(t *testing.T, rate string) workload {
	ctx := context.Background()
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	w := workload{ns: "e2e-" + id, exchange: "ms2m-" + id, queue: "work-" + id}
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			l.dumpDiagnostics(t, w)
		}
		_ = l.client.CoreV1().Namespaces().Delete(context.Background(), w.ns, metav1.DeleteOptions{})
	})
	// The default service account appears asynchronously; pods need it.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := l.client.CoreV1().ServiceAccounts(w.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal("no default service account:", err)
	}
	common := []string{"--url=" + l.brokerURL, "--exchange=" + w.exchange, "--queue=" + w.queue}
	pods := []*corev1.Pod{
		l.pod(w, "producer", "ms2m-producer", append(common, "--rate="+rate), nil),
		l.pod(w, "consumer", "ms2m-consumer", append(common, "--work=50ms"), map[string]string{
			"ms2m.io/broker-url": l.brokerURL, "ms2m.io/exchange": w.exchange, "ms2m.io/queue": w.queue,
			"ms2m.io/registry": l.registry + "/checkpoints",
		}),
	}
	// The consumer first, so the queue exists before messages flow.
	for _, p := range []*corev1.Pod{pods[1], pods[0]} {
		if _, err := l.client.CoreV1().Pods(w.ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		l.waitApp(t, w, p.Name)
	}
	return w
}

func (l *lab) pod(w workload, name, image string, args []string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns, Annotations: annotations, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName: "node-a",
			Containers: []corev1.Container{{
				Name: name, Image: l.imagePrefix + "/" + image + ":lab", ImagePullPolicy: corev1.PullAlways,
				Args: args, Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}
}

func (l *lab) target(w workload, pod string) appctl.Target {
	return appctl.Target{Namespace: w.ns, Pod: pod, Port: 8080}
}

func (l *lab) waitApp(t *testing.T, w workload, pod string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := l.app.State(ctx, l.target(w, pod))
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("%s never answered: %v", pod, err)
	}
}

func (l *lab) state(t *testing.T, w workload, pod string) ms2m.State {
	t.Helper()
	st, err := l.app.State(context.Background(), l.target(w, pod))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (l *lab) waitApplied(t *testing.T, w workload, pod string, seq uint64) ms2m.State {
	t.Helper()
	var st ms2m.State
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		st, err = l.app.State(ctx, l.target(w, pod))
		return err == nil && st.LastSeq >= seq, nil
	})
	if err != nil {
		t.Fatalf("%s did not reach sequence %d (at %d): %v", pod, seq, st.LastSeq, err)
	}
	return st
}

// producerTotals stops the producer and returns what the broker confirmed.
func (l *lab) producerTotals(t *testing.T, w workload) ms2m.ProducerState {
	t.Helper()
	body, err := l.client.CoreV1().RESTClient().Post().Namespace(w.ns).Resource("pods").Name("producer:8080").
		SubResource("proxy").Suffix("ms2m/control").Body([]byte(`{"type":"STOP"}`)).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("stop producer: %v %s", err, body)
	}
	var st ms2m.ProducerState
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		raw, err := l.client.CoreV1().RESTClient().Get().Namespace(w.ns).Resource("pods").Name("producer:8080").
			SubResource("proxy").Suffix("ms2m/state").DoRaw(ctx)
		return err == nil && json.Unmarshal(raw, &st) == nil && st.Stopped, nil
	})
	if err != nil {
		t.Fatal("producer did not stop:", err)
	}
	return st
}

// migrate runs kubectl migrate through the real kubectl plugin mechanism.
func (l *lab) migrate(t *testing.T, w workload, args ...string) (report.Record, string, error) {
	t.Helper()
	argv := append([]string{"migrate", "-n", w.ns}, args...)
	argv = append(argv, "--agent-image", l.imagePrefix+"/kubectl-migrate-agent:lab", "--insecure-registry", "-o", "json")
	cmd := exec.Command(l.kubectl, argv...)
	cmd.Env = append(os.Environ(), "PATH="+l.pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"), "NO_COLOR=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	err := cmd.Run()
	t.Logf("kubectl %s (%s):\n%s", strings.Join(argv, " "), time.Since(t0).Round(time.Millisecond), stderr.String())
	var rec report.Record
	if jerr := json.Unmarshal(stdout.Bytes(), &rec); jerr != nil && err == nil {
		t.Fatalf("not a record: %v\n%s", jerr, stdout.String())
	}
	return rec, stderr.String(), err
}

// kubectlMigrate runs another kubectl migrate command and returns its output.
func (l *lab) kubectlMigrate(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(l.kubectl, append([]string{"migrate"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+l.pluginDir+string(os.PathListSeparator)+os.Getenv("PATH"), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl migrate %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func (l *lab) replayQueueGone(t *testing.T, w workload) {
	t.Helper()
	b, err := broker.Dial(l.brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.QueueDepth(ms2m.ReplayQueueName(w.queue)); !broker.IsNotFound(err) {
		t.Fatalf("replay queue still there (%v)", err)
	}
}

func (l *lab) dumpDiagnostics(t *testing.T, w workload) {
	pods, _ := l.client.CoreV1().Pods(w.ns).List(context.Background(), metav1.ListOptions{})
	for _, p := range pods.Items {
		t.Logf("pod %s on %s: %s %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
	}
	events, _ := l.client.CoreV1().Events(w.ns).List(context.Background(), metav1.ListOptions{})
	for _, e := range events.Items {
		t.Logf("event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
	}
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
