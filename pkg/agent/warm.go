package agent

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// Serving holds the serving agents a Launcher started, one per node.
type Serving struct {
	mu   sync.Mutex
	pods map[string]served // by node
	// token is the agents' control token, one per migration, chosen at the
	// first Warm and kept only in this process's memory.
	token string
}

// controlToken returns the migration's control token, choosing it first.
func (w *Serving) controlToken() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.token == "" {
		w.token = rand.Text()
	}
	return w.token
}

type served struct {
	pod  string
	port int
	// runtime: the agent can ask the node's runtime to pull.
	runtime bool
	// fences: the agent may cut pods off the network (Fence).
	fences bool
}

func (w *Serving) pod(node string) (served, bool) {
	if w == nil {
		return served{}, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.pods[node]
	return p, ok
}

// WarmOptions configure a serving agent.
type WarmOptions struct {
	// DirectToken makes the agent a direct transfer's target with this push
	// token: it runs on the node's network, on DirectPort.
	DirectToken string
	// RuntimeSocket is the node's CRI socket (RuntimeSocket), mounted so
	// the agent pulls images through the runtime without starting a pod.
	RuntimeSocket string
	// Volumes mounts the kubelet's pods directory, read-only, so the agent
	// can snapshot a migrated pod's emptyDir volumes (SnapshotVolumes); an
	// agent is given it only for a migration that carries such volumes.
	Volumes bool
	// Fence lets the agent, which must reach the runtime, cut a pod of its
	// namespace off the network (Launcher.Fence): it gets the node's pinned
	// network namespaces and the capabilities to enter them and set their
	// firewall. Only a migration of a pod that does not follow the MS2M
	// contract asks for it.
	Fence bool
	// Stage makes a direct transfer's target extract each checkpoint it
	// receives into the node's ociruntime.StageDir, where the
	// kubectl-migrate runtime restores it, instead of serving it as an
	// image: the restore path that needs no CRI restore.
	Stage bool
}

// directDir is where a direct-transfer agent keeps what it receives.
const directDir = "/var/lib/kubectl-migrate/direct"

// warmReadyTimeout bounds the wait for a serving agent to answer once its
// container runs.
const warmReadyTimeout = time.Minute

// Warm starts a serving agent named podName on node and waits until it
// answers: later Pack and Remove calls on node go to it instead of starting
// a pod each. A node that cannot pull or run the agent image fails here.
func (l Launcher) Warm(ctx context.Context, podName, node string, opts WarmOptions) error {
	if l.Serving == nil {
		return errors.New("this launcher keeps no warm agents")
	}
	req := AgentRequest{
		Node: node, Image: l.Image, Command: commandServe,
		Direct: opts.DirectToken != "", Stage: opts.DirectToken != "" && opts.Stage,
		RuntimeSocket: opts.RuntimeSocket, Volumes: opts.Volumes, Fence: opts.Fence,
	}
	port := req.servePort()
	if err := l.requestAgent(ctx, podName, req, l.Serving.controlToken(), opts.DirectToken); err != nil {
		return err
	}
	l.Serving.mu.Lock()
	if l.Serving.pods == nil {
		l.Serving.pods = map[string]served{}
	}
	l.Serving.pods[node] = served{pod: podName, port: port, runtime: opts.RuntimeSocket != "", fences: opts.Fence}
	l.Serving.mu.Unlock()
	if _, err := kube.WaitForPod(ctx, l.Client, l.Namespace, podName, agentRunning(l.Image)); err != nil {
		return err
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, warmReadyTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := l.call(ctx, served{pod: podName, port: port}, http.MethodGet, healthPath, nil)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the agent on %s runs but does not answer on port %d: %w", node, port, err)
	}
	return nil
}

// HoldsReceivePort reports whether pod claims its node's receive port, as
// a direct transfer's target does (directPod): the kubelet starts no second
// one on that node while it runs.
func HoldsReceivePort(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool {
		return slices.ContainsFunc(c.Ports, func(port corev1.ContainerPort) bool { return port.HostPort == DirectReceivePort })
	})
}

// directPod makes pod a direct transfer's target: on the node's network, so
// that the node's runtime pulls from it on localhost and the source's agent
// reaches it at the node's address.
func directPod(pod *corev1.Pod) {
	pod.Spec.HostNetwork = true
	pod.Spec.DNSPolicy = corev1.DNSClusterFirstWithHostNet
	c := &pod.Spec.Containers[0]
	c.Args = append(c.Args, "--direct", directDir)
	// Declared, so that the scheduler sees the node's port taken.
	c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: DirectReceivePort, HostPort: DirectReceivePort})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "direct", MountPath: directDir})
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "direct", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
}

// mountStage gives an agent pod the node's stage (ociruntime.StageDir),
// made root-only if it is new.
func mountStage(pod *corev1.Pod) {
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "stage", MountPath: ociruntime.StageDir})
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "stage", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: ociruntime.StageDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
	}})
}

// Release ends every agent of the launcher's migration (its labels), warm
// or left by a process that died, by deleting its request, and deletes the
// pullers in the application's namespace; it waits until they are gone.
func (l Launcher) Release(ctx context.Context) error {
	selector := labels.SelectorFromSet(l.Labels).String()
	var errs []error
	agents := map[string]bool{}
	if l.Serving != nil {
		l.Serving.mu.Lock()
		for _, p := range l.Serving.pods {
			agents[p.pod] = true
		}
		l.Serving.pods = nil
		l.Serving.mu.Unlock()
	}
	for _, ns := range slices.Compact([]string{l.Namespace, l.appNamespace()}) {
		list, err := l.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("list agent pods in %s: %w", ns, err))
			continue
		}
		for _, p := range list.Items {
			if ns == l.Namespace {
				agents[p.Name] = true
				continue
			}
			errs = append(errs, kube.DeleteAndWait(ctx, l.Client, ns, p.Name, ptr.To[int64](0)))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(agents)) {
		errs = append(errs, l.End(ctx, name))
	}
	return errors.Join(errs...)
}

// call sends one request to a serving agent.
func (l Launcher) call(ctx context.Context, agent served, verb, path string, body any) ([]byte, error) {
	podName := agent.pod
	req := l.Client.CoreV1().RESTClient().Verb(verb).Namespace(l.Namespace).Resource("pods").
		Name(podName + ":" + strconv.Itoa(agent.port)).SubResource("proxy").Suffix(strings.TrimPrefix(path, "/"))
	if l.Serving != nil {
		req = req.SetHeader(ControlTokenHeader, l.Serving.controlToken())
	}
	if body != nil {
		payload, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		req = req.SetHeader("Content-Type", "application/json").Body(payload)
	}
	out, err := req.DoRaw(ctx)
	if err != nil {
		if detail := strings.TrimSpace(string(out)); detail != "" {
			return nil, fmt.Errorf("agent %s: %s", podName, detail)
		}
		return nil, fmt.Errorf("agent %s: %w", podName, err)
	}
	return out, nil
}

// ErrPortInUse: an agent on the node's network ended because another
// process held its port, such as another migration's receiver that was
// still ending.
var ErrPortInUse = errors.New("its port was in use")

// agentRunning holds once the serving agent's container runs, and fails
// fast on states that will not get there.
func agentRunning(image string) kube.PodCondition {
	finished := agentFinished(image)
	return func(pod *corev1.Pod) (bool, error) {
		if done, err := finished(pod); err != nil || done {
			if err == nil {
				msg := terminationMessage(pod)
				err = fmt.Errorf("the agent on %s ended: %s", pod.Spec.NodeName, msg)
				if strings.Contains(msg, "address already in use") {
					err = fmt.Errorf("%w: %w", ErrPortInUse, err)
				}
			}
			return false, err
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == "agent" && cs.State.Running != nil {
				return true, nil
			}
		}
		return false, nil
	}
}
