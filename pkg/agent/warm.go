package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
)

// Serving holds the serving agents a Launcher started, one per node.
type Serving struct {
	mu   sync.Mutex
	pods map[string]string // node → pod
}

func (w *Serving) pod(node string) (string, bool) {
	if w == nil {
		return "", false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.pods[node]
	return p, ok
}

// warmReadyTimeout bounds the wait for a serving agent to answer once its
// container runs.
const warmReadyTimeout = time.Minute

// Warm starts a serving agent named podName on node and waits until it
// answers: later Pack and Remove calls on node go to it instead of starting
// a pod each. A node that cannot pull or run the agent image fails here.
func (l Launcher) Warm(ctx context.Context, podName, node string) error {
	if l.Serving == nil {
		return errors.New("this launcher keeps no warm agents")
	}
	pod := l.PodSpec(podName, node, []string{"serve"})
	pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: ServePort}}
	if _, err := l.Client.CoreV1().Pods(l.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create agent pod on %s: %w", node, err)
	}
	l.Serving.mu.Lock()
	if l.Serving.pods == nil {
		l.Serving.pods = map[string]string{}
	}
	l.Serving.pods[node] = podName
	l.Serving.mu.Unlock()
	if _, err := kube.WaitForPod(ctx, l.Client, l.Namespace, podName, agentRunning(l.Image)); err != nil {
		return err
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, warmReadyTimeout, true, func(ctx context.Context) (bool, error) {
		_, err := l.call(ctx, podName, http.MethodGet, healthPath, nil)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the agent on %s runs but does not answer on port %d: %w", node, ServePort, err)
	}
	return nil
}

// Release deletes every agent pod of the launcher's migration (its labels),
// warm or left by a process that died, and waits until they are gone.
func (l Launcher) Release(ctx context.Context) error {
	list, err := l.Client.CoreV1().Pods(l.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(l.Labels).String()})
	if err != nil {
		return fmt.Errorf("list agent pods: %w", err)
	}
	var errs []error
	for _, p := range list.Items {
		errs = append(errs, kube.DeleteAndWait(ctx, l.Client, l.Namespace, p.Name, ptr.To[int64](0)))
	}
	if l.Serving != nil {
		l.Serving.mu.Lock()
		l.Serving.pods = nil
		l.Serving.mu.Unlock()
	}
	return errors.Join(errs...)
}

// call sends one request to the serving agent podName.
func (l Launcher) call(ctx context.Context, podName, verb, path string, body any) ([]byte, error) {
	req := l.Client.CoreV1().RESTClient().Verb(verb).Namespace(l.Namespace).Resource("pods").
		Name(podName + ":" + strconv.Itoa(ServePort)).SubResource("proxy").Suffix(strings.TrimPrefix(path, "/"))
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

// agentRunning holds once the serving agent's container runs, and fails
// fast on states that will not get there.
func agentRunning(image string) kube.PodCondition {
	finished := agentFinished(image)
	return func(pod *corev1.Pod) (bool, error) {
		if done, err := finished(pod); err != nil || done {
			if err == nil {
				err = fmt.Errorf("the agent on %s ended: %s", pod.Spec.NodeName, terminationMessage(pod))
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
