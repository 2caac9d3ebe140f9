package conformance

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// Environment variables that tell an application its broker topology
// (docs/contract.md): how the check starts an image it knows nothing else
// about.
const (
	EnvBrokerURL = "MS2M_BROKER_URL"
	EnvExchange  = "MS2M_EXCHANGE"
	EnvQueue     = "MS2M_QUEUE"
)

// PodSpec is the application under test, as a pod.
type PodSpec struct {
	Image     string
	Args      []string
	Port      int    // its contract endpoint
	Node      string // where it starts ("": the scheduler's choice)
	BrokerURL string // as the pod reaches the broker
	Registry  string // ms2m.io/registry of the pod, for the migration
}

// Scratch is one instance of the application under test, alone in a
// namespace of its own with a scratch exchange and queue.
type Scratch struct {
	Namespace, Pod, Exchange, Queue string
	client                          kubernetes.Interface
	token                           string // the namespace's control token
}

// Start creates the namespace and the pod and waits until the application
// answers on its endpoint. The Scratch it returns (also with an error) is
// to be deleted.
func Start(ctx context.Context, client kubernetes.Interface, spec PodSpec) (*Scratch, error) {
	id := rand.String(5)
	s := &Scratch{Namespace: "ms2m-conformance-" + id, Pod: "app", Exchange: "ms2m-conformance-" + id, Queue: "ms2m-conformance-" + id, client: client}
	labels := map[string]string{kube.ManagedByLabel: kube.ManagedBy, "app.kubernetes.io/component": "conformance"}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.Namespace, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", s.Namespace, err)
	}
	var err error
	if s.token, _, err = appctl.EnsureToken(ctx, client, s.Namespace); err != nil {
		return s, err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.Pod, Namespace: s.Namespace, Labels: labels, Annotations: map[string]string{
			migrate.BrokerURLAnnotation: spec.BrokerURL, migrate.ExchangeAnnotation: s.Exchange, migrate.QueueAnnotation: s.Queue,
			migrate.ControlPortAnnotation: strconv.Itoa(spec.Port), migrate.RegistryAnnotation: spec.Registry,
		}},
		Spec: corev1.PodSpec{
			NodeName: spec.Node,
			// The default service account appears asynchronously; the
			// application needs none.
			AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{
				Name: "app", Image: spec.Image, Args: spec.Args,
				Env: []corev1.EnvVar{
					{Name: EnvBrokerURL, Value: spec.BrokerURL}, {Name: EnvExchange, Value: s.Exchange}, {Name: EnvQueue, Value: s.Queue},
				},
				Ports: []corev1.ContainerPort{{ContainerPort: int32(spec.Port)}},
			}},
		},
	}
	appctl.MountToken(&pod.Spec)
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Pods(s.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		// A new namespace refuses pods until its service account exists.
		return err == nil, ignoreForbidden(err)
	}); err != nil {
		return s, fmt.Errorf("create the application's pod: %w", err)
	}
	if _, err := kube.WaitForPod(ctx, client, s.Namespace, s.Pod, kube.ContainersRunning("application's ", []string{"app"})); err != nil {
		return s, err
	}
	app := s.App(spec.Port)
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := app.State(ctx)
		return err == nil, nil
	}); err != nil {
		return s, fmt.Errorf("the application runs but never answered GET %s on port %d", protocol.StatePath, spec.Port)
	}
	return s, nil
}

func ignoreForbidden(err error) error {
	if apierrors.IsForbidden(err) {
		return nil
	}
	return err
}

// App is the pod named pod of the scratch namespace (the application, or
// its restored copy), reached through the API server's pod proxy.
func (s *Scratch) App(port int) App { return s.AppIn(s.Pod, port) }

// AppIn is App for another pod of the namespace.
func (s *Scratch) AppIn(pod string, port int) App {
	return proxied{c: appctl.Client{REST: s.client.CoreV1().RESTClient()}, t: appctl.Target{Namespace: s.Namespace, Pod: pod, Port: port, Token: s.token}}
}

// Delete removes the application's pods first (so that nothing declares
// the queues again), then the scratch topology on the broker at url, then
// the namespace.
func (s *Scratch) Delete(ctx context.Context, url string) error {
	pods, err := s.client.CoreV1().Pods(s.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if pods != nil {
		for _, p := range pods.Items {
			if err := kube.DeleteAndWait(ctx, s.client, s.Namespace, p.Name, nil); err != nil {
				return err
			}
		}
	}
	if err := deleteTopology(url, s.Exchange, s.Queue); err != nil {
		return fmt.Errorf("remove the scratch queues: %w", err)
	}
	err = s.client.CoreV1().Namespaces().Delete(ctx, s.Namespace, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

type proxied struct {
	c appctl.Client
	t appctl.Target
}

func (p proxied) State(ctx context.Context) (protocol.State, error) { return p.c.State(ctx, p.t) }
func (p proxied) WithToken(token string) App                        { p.t.Token = token; return p }
func (p proxied) Control(ctx context.Context, msg protocol.Control) (protocol.State, error) {
	return p.c.Control(ctx, p.t, msg)
}
