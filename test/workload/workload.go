// Package workload deploys the sample MS2M workload (the paper's producer and
// 50 ms-per-message consumer) on the lab cluster, for the e2e tests and the
// demo.
package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/sample"
)

// Options say where the workload runs and what it reaches.
type Options struct {
	Namespace   string // created; empty: a fresh "e2e-<random>"
	Node        string
	ImagePrefix string // e.g. 198.51.100.1:5000/kubectl-migrate
	BrokerURL   string
	Registry    string // checkpoint images go to Registry/checkpoints
	Rate        string // producer messages per second
	Work        string // consumer time per message
	Ballast     string // extra resident memory of the consumer, e.g. 64Mi
	// VerifyBallast has the consumer recompute its ballast's checksum
	// this often, ending if it changed (e.g. "2s").
	VerifyBallast string
	// LivenessFailures is the consumer's liveness failureThreshold (0: 3,
	// a probe every 5 s timing out after 2 s: 12 s frozen restart it).
	LivenessFailures int32
	// RuntimeClass runs the consumer under this RuntimeClass.
	RuntimeClass string
	// App is the application: "" the sample (ms2m-consumer and
	// ms2m-producer), "inventory" the example in examples/inventory,
	// "python" the sample's consumer in Python (examples/python) with the
	// sample's producer.
	App string
	// PodSecurity is the Pod Security level the namespace enforces
	// (e.g. baseline); empty enforces none.
	PodSecurity string
	// Scratch gives the sample consumer an emptyDir at /scratch ("disk",
	// or "memory" for medium: Memory) where it keeps a ledger of every
	// value it applies; CheckConservation then checks the ledger too.
	Scratch string
	// Sidecar gives the consumer a native sidecar (an init container with
	// restartPolicy Always), SidecarName, running the agent image's canary.
	Sidecar bool
}

// SidecarName is the consumer's sidecar (Options.Sidecar).
const SidecarName = "sidecar"

// Workload is one producer/consumer pair in a namespace of its own, with
// queue names of its own, so runs never see each other's messages.
type Workload struct {
	Namespace, Exchange, Queue string
	// Token is the control token calls to its applications carry; empty:
	// the one in the namespace's Secret protocol.ControlSecret.
	Token    string
	client   kubernetes.Interface
	app      appctl.Client
	producer *corev1.Pod // as created, for RestartProducer
	// earlier is what the producer's runs before RestartProducer confirmed.
	earlier protocol.Totals
}

// Attach returns a Workload for pods deployed by other means.
func Attach(client kubernetes.Interface, namespace, exchange, queue string) *Workload {
	return &Workload{Namespace: namespace, Exchange: exchange, Queue: queue, client: client,
		app: appctl.Client{REST: client.CoreV1().RESTClient()}}
}

// Deploy creates the namespace and both pods and waits until they answer.
func Deploy(ctx context.Context, client kubernetes.Interface, o Options) (*Workload, error) {
	id := fmt.Sprintf("%06x", rand.Uint32()>>8)
	w := &Workload{Namespace: o.Namespace, Exchange: "ms2m-" + id, Queue: "work-" + id, client: client,
		app: appctl.Client{REST: client.CoreV1().RESTClient()}}
	if w.Namespace == "" {
		w.Namespace = "e2e-" + id
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.Namespace}}
	if o.PodSecurity != "" {
		ns.Labels = map[string]string{"pod-security.kubernetes.io/enforce": o.PodSecurity}
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	// The default service account appears asynchronously; pods need it.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(w.Namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return w, fmt.Errorf("no default service account in %s: %w", w.Namespace, err)
	}
	token, err := CreateControlToken(ctx, client, w.Namespace)
	if err != nil {
		return w, err
	}
	w.Token = token
	common := []string{"--url=" + o.BrokerURL, "--exchange=" + w.Exchange, "--queue=" + w.Queue}
	consumerImage, consumerArgs := "ms2m-consumer", append(slices.Clone(common), "--work="+o.Work)
	producerImage, producerArgs := "ms2m-producer", append(slices.Clone(common), "--rate="+o.Rate)
	if o.Ballast != "" {
		consumerArgs = append(consumerArgs, "--ballast="+o.Ballast)
		if o.VerifyBallast != "" {
			consumerArgs = append(consumerArgs, "--verify-ballast="+o.VerifyBallast)
		}
	}
	switch o.App {
	case "inventory":
		consumerImage, consumerArgs = "inventory", append([]string{"consume"}, common...)
		producerImage, producerArgs = "inventory", append([]string{"produce", "--rate=" + o.Rate}, common...)
	case "python":
		consumerImage = "python-consumer"
	}
	consumer := w.pod(o, "consumer", consumerImage, consumerArgs, map[string]string{
		"ms2m.io/broker-url": o.BrokerURL, "ms2m.io/exchange": w.Exchange, "ms2m.io/queue": w.Queue,
		"ms2m.io/registry": o.Registry + "/checkpoints",
	})
	AddProbes(&consumer.Spec.Containers[0])
	if o.LivenessFailures > 0 {
		consumer.Spec.Containers[0].LivenessProbe.FailureThreshold = o.LivenessFailures
	}
	if o.Ballast != "" {
		// A memory limit tells a migration how much there is to move
		// (what it predicts a freeze from): the ballast and room for the
		// rest of the process.
		limit := resource.MustParse(o.Ballast)
		limit.Add(resource.MustParse("256Mi"))
		consumer.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: limit}
	}
	if o.RuntimeClass != "" {
		consumer.Spec.RuntimeClassName = &o.RuntimeClass
	}
	if o.Scratch != "" {
		medium := corev1.StorageMediumDefault
		if o.Scratch == "memory" {
			medium = corev1.StorageMediumMemory
		}
		consumer.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: medium}}}}
		c := &consumer.Spec.Containers[0]
		c.VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
		c.Args = append(c.Args, "--ledger=/scratch/ledger")
	}
	if o.Sidecar {
		consumer.Spec.InitContainers = []corev1.Container{{
			Name: SidecarName, Image: o.ImagePrefix + "/kubectl-migrate-agent:lab", Args: []string{"canary"},
			RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		}}
	}
	producer := w.pod(o, "producer", producerImage, producerArgs, nil)
	for _, p := range []*corev1.Pod{consumer, producer} {
		MountControlToken(&p.Spec)
	}
	w.producer = producer.DeepCopy()
	// The consumer first, so its queue exists before messages flow.
	for _, p := range []*corev1.Pod{consumer, producer} {
		if err := w.start(ctx, p); err != nil {
			return w, err
		}
	}
	return w, nil
}

// start creates p and waits until it answers.
func (w *Workload) start(ctx context.Context, p *corev1.Pod) error {
	if _, err := w.client.CoreV1().Pods(w.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return err
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := w.app.State(ctx, w.Target(p.Name))
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("%s never answered: %w", p.Name, err)
	}
	return nil
}

// RestartProducer stops the producer, keeps what it confirmed for
// CheckConservation, and starts a new run of it: a new process whose
// sequence starts at 1 again.
func (w *Workload) RestartProducer(ctx context.Context) (ms2m.ProducerState, error) {
	if w.producer == nil {
		return ms2m.ProducerState{}, fmt.Errorf("the producer of %s was not deployed by Deploy", w.Namespace)
	}
	sent, err := w.StopProducer(ctx)
	if err != nil {
		return sent, err
	}
	w.earlier = w.earlier.Plus(sent.Totals)
	if err := kube.DeleteAndWait(ctx, w.client, w.Namespace, w.producer.Name, nil); err != nil {
		return sent, err
	}
	return sent, w.start(ctx, w.producer.DeepCopy())
}

func (w *Workload) pod(o Options, name, image string, args []string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.Namespace, Annotations: annotations, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName: o.Node,
			Containers: []corev1.Container{{
				Name: name, Image: o.ImagePrefix + "/" + image + ":lab", ImagePullPolicy: corev1.PullAlways,
				Args: args, Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}
}

// AddProbes gives a consumer container the contract's liveness (/healthz)
// and readiness (/readyz: not ready while it holds) probes, which a
// migration keeps.
func AddProbes(c *corev1.Container) {
	probe := func(path string, period int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt32(8080)}},
			PeriodSeconds: period, TimeoutSeconds: 2, FailureThreshold: 3,
		}
	}
	c.LivenessProbe, c.ReadinessProbe = probe("/healthz", 5), probe("/readyz", 2)
}

// Delete removes the namespace and with it everything in it.
func (w *Workload) Delete(ctx context.Context) error {
	return w.client.CoreV1().Namespaces().Delete(ctx, w.Namespace, metav1.DeleteOptions{})
}

// Target addresses a pod's MS2M endpoint.
func (w *Workload) Target(pod string) appctl.Target {
	return appctl.Target{Namespace: w.Namespace, Pod: pod, Port: 8080, Token: w.token(context.Background())}
}

// State reads a consumer's state.
func (w *Workload) State(ctx context.Context, pod string) (protocol.State, error) {
	return w.app.State(ctx, w.Target(pod))
}

// WaitApplied waits until pod has applied sequence seq of the producer's
// current run.
func (w *Workload) WaitApplied(ctx context.Context, pod string, seq uint64, timeout time.Duration) (protocol.State, error) {
	st, err := w.waitState(ctx, pod, timeout, func(st protocol.State) bool { return st.LastSeq >= seq })
	if err != nil {
		return st, fmt.Errorf("%s did not reach sequence %d (at %d): %w", pod, seq, st.LastSeq, err)
	}
	return st, nil
}

// waitState polls pod's state until done says so.
// WaitFor waits until pod's state satisfies done.
func (w *Workload) WaitFor(ctx context.Context, pod string, timeout time.Duration, done func(protocol.State) bool) (protocol.State, error) {
	return w.waitState(ctx, pod, timeout, done)
}

// Control sends a control message to pod's application.
func (w *Workload) Control(ctx context.Context, pod string, msg protocol.Control) (protocol.State, error) {
	return w.app.Control(ctx, w.Target(pod), msg)
}

func (w *Workload) waitState(ctx context.Context, pod string, timeout time.Duration, done func(protocol.State) bool) (protocol.State, error) {
	var st protocol.State
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		st, err = w.State(ctx, pod)
		return err == nil && done(st), nil
	})
	return st, err
}

// ProducerLabels are the labels a producer's pod carries, by which
// StopProducer finds it wherever it moved.
func ProducerLabels() map[string]string { return map[string]string{"app": "producer"} }

// producerPod names the producer's pod: the running one with its labels, so
// that a producer a drain moved (its copy, under another name) is found.
func (w *Workload) producerPod(ctx context.Context) string {
	list, err := w.client.CoreV1().Pods(w.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(ProducerLabels()).String()})
	if err == nil {
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				return p.Name
			}
		}
	}
	return "producer"
}

// StopProducer stops the producer and returns what the broker confirmed.
func (w *Workload) StopProducer(ctx context.Context) (ms2m.ProducerState, error) {
	name := w.producerPod(ctx) + ":8080"
	body, err := w.client.CoreV1().RESTClient().Post().Namespace(w.Namespace).Resource("pods").Name(name).
		SubResource("proxy").Suffix(protocol.ControlPath).SetHeader(protocol.TokenHeader, w.token(ctx)).Body([]byte(`{"type":"STOP"}`)).DoRaw(ctx)
	if err != nil {
		return ms2m.ProducerState{}, fmt.Errorf("stop producer: %w: %s", err, body)
	}
	var st ms2m.ProducerState
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		raw, err := w.client.CoreV1().RESTClient().Get().Namespace(w.Namespace).Resource("pods").Name(name).
			SubResource("proxy").Suffix(protocol.StatePath).SetHeader(protocol.TokenHeader, w.token(ctx)).DoRaw(ctx)
		return err == nil && json.Unmarshal(raw, &st) == nil && st.Stopped, nil
	})
	return st, err
}

// CheckConservation stops the producer, lets consumer drain and compares its
// applied set with the producer's confirmed set. The producer's state it
// returns carries the totals of all its runs (RestartProducer).
func (w *Workload) CheckConservation(ctx context.Context, consumer string) (protocol.State, ms2m.ProducerState, error) {
	sent, err := w.StopProducer(ctx)
	if err != nil {
		return protocol.State{}, sent, err
	}
	got, err := w.waitState(ctx, consumer, 3*time.Minute, func(st protocol.State) bool { return st.Reached(sent.Position()) })
	if err != nil {
		return got, sent, fmt.Errorf("%s did not reach the producer's last message %s (at %s): %w", consumer, sent.Position(), got.Position(), err)
	}
	want := w.earlier.Plus(sent.Totals)
	if !got.Totals.Equal(want) {
		return got, sent, fmt.Errorf("conservation broken: applied %+v, sent %+v (at %s of %s, skipped %d)",
			got.Totals, want, got.Position(), sent.Position(), got.Skipped)
	}
	if got.Parked > 0 {
		return got, sent, fmt.Errorf("%s parked %d messages it could not apply", consumer, got.Parked)
	}
	app, err := checkLedger(got)
	if err != nil {
		return got, sent, err
	}
	// The application's own account (the sample's sum, the inventory's
	// digest) is compared too where it covers one producer run.
	if w.earlier.Count == 0 && (len(app) > 0 || len(sent.App) > 0) && !sameJSON(app, sent.App) {
		return got, sent, fmt.Errorf("the application's state differs: %s applied %s, the producer confirmed %s", consumer, got.App, sent.App)
	}
	sent.Totals = want
	return got, sent, nil
}

// checkLedger checks the sample's ledger file, where it keeps one: it must
// hold every applied message's value exactly once (as many lines as
// messages applied, summing to the sum in memory), so files and memory
// moved together. It returns the application's state without the ledger's
// figures, which the producer does not keep.
func checkLedger(got protocol.State) (json.RawMessage, error) {
	var app sample.State
	if len(got.App) == 0 || json.Unmarshal(got.App, &app) != nil || (app.LedgerLines == 0 && app.LedgerError == "") {
		return got.App, nil
	}
	if app.LedgerError != "" || uint64(app.LedgerLines) != got.Totals.Count || app.LedgerSum != app.Sum {
		return nil, fmt.Errorf("the ledger file holds %d values summing to %d (%s), but %d messages were applied, summing to %d: files and memory did not move together",
			app.LedgerLines, app.LedgerSum, app.LedgerError, got.Totals.Count, app.Sum)
	}
	return json.Marshal(sample.State{Sum: app.Sum})
}

// sameJSON reports whether a and b encode the same value.
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}
