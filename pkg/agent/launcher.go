package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// Paths inside the agent container.
const (
	registryConfigDir = "/var/run/kubectl-migrate/registry"
	checkpointVolume  = "checkpoints"
	registryVolume    = "registry-auth"
)

// DefaultNamespace is where agents run unless told otherwise. Agents need
// root, the kubelet's checkpoint directory and the runtime's socket: in a
// namespace of their own, whose Pod Security level allows that, the
// applications' namespaces need no more than the applications do, and
// nobody who may only edit an application's namespace can read, change or
// call an agent (nor read the token in its environment).
const DefaultNamespace = "kubectl-migrate-system"

// Launcher runs the agent in short-lived pods, which it requests from the
// agents' controller (AgentRequest): those who migrate create no pod where
// agents run.
type Launcher struct {
	Client kubernetes.Interface
	// Image is the agent image: the controller's (node-setup's
	// --agent-image), which it checks.
	Image string
	// Namespace is where the agents run (DefaultNamespace), which
	// node-setup creates with the agents' controller.
	Namespace string
	// AppNamespace is the migrated pod's: its RegistrySecret and
	// PullSecrets live there, and the pods that pull its images run there.
	// Empty means Namespace.
	AppNamespace string
	// ID is the migration's.
	ID string
	// RegistrySecret is a kubernetes.io/dockerconfigjson secret in
	// AppNamespace that the agent pushes with, copied into each request;
	// empty for an anonymous registry.
	RegistrySecret string
	// PullSecrets are the migrated pod's, for pulling its images.
	PullSecrets []corev1.LocalObjectReference
	// Labels mark every agent pod of one migration (Release finds them so).
	Labels map[string]string
	// Serving, if set, keeps the agents Warm starts, which Pack and
	// Remove then use.
	Serving *Serving
}

// Pack packs and pushes one archive on node and returns the agent's result:
// through the node's warm agent if it has one, else in a pod of its own.
func (l Launcher) Pack(ctx context.Context, podName, node string, req PackRequest) (PackResult, error) {
	if warm, ok := l.Serving.pod(node); ok {
		out, err := l.call(ctx, warm, http.MethodPost, packPath, req)
		if err != nil {
			return PackResult{}, err
		}
		return decodeAnswer[PackResult](node, out)
	}
	if req.isDirect() {
		return PackResult{}, fmt.Errorf("a transfer without a registry needs the warm agent on %s, which is gone; run the migration again", node)
	}
	args := []string{"--archive", req.Archive, "--container", req.Container, "--image", req.Image}
	if req.Insecure {
		args = append(args, "--insecure")
	}
	if req.KeepArchive {
		args = append(args, "--keep-archive")
	}
	msg, err := l.runRequested(ctx, podName, AgentRequest{Node: node, Image: l.Image, Command: commandPack, Args: args})
	if err != nil {
		return PackResult{}, err
	}
	var res PackResult
	if err := json.Unmarshal([]byte(msg), &res); err != nil {
		return PackResult{}, fmt.Errorf("agent reported %q: %w", msg, err)
	}
	return res, nil
}

// SnapshotVolumes has node's warm agent (started with WarmOptions.Volumes)
// snapshot a pod's emptyDir volumes, or with no req.Archive measure them.
func (l Launcher) SnapshotVolumes(ctx context.Context, node string, req SnapshotRequest) (SnapshotResult, error) {
	warm, ok := l.Serving.pod(node)
	if !ok {
		return SnapshotResult{}, fmt.Errorf("snapshotting emptyDir volumes needs the warm agent on %s, which is gone; run the migration again", node)
	}
	out, err := l.call(ctx, warm, http.MethodPost, volumesPath, req)
	if err != nil {
		return SnapshotResult{}, err
	}
	return decodeAnswer[SnapshotResult](node, out)
}

// Remove deletes checkpoint archives on node (through its warm agent if it
// has one).
func (l Launcher) Remove(ctx context.Context, podName, node string, archives []string) error {
	if warm, ok := l.Serving.pod(node); ok {
		_, err := l.call(ctx, warm, http.MethodPost, removePath, removeRequest{Archives: archives})
		return err
	}
	staged := slices.ContainsFunc(archives, func(a string) bool { _, staged := stagedIdentity(a); return staged })
	_, err := l.runRequested(ctx, podName, AgentRequest{Node: node, Image: l.Image, Command: commandRemove, Args: archives, MountStage: staged})
	return err
}

// Prepull makes node pull images. CRI-O restores a checkpoint on top of the
// checkpointed container's own image, looked up by ID on the target node,
// so that image must be there first. Each image runs the agent binary (from
// a shared volume, so images without a shell work too), which exits at once.
//
// A warm agent on node that reaches the runtime asks it directly first:
// images the node has are found in milliseconds, with no pod to start.
func (l Launcher) Prepull(ctx context.Context, podName, node string, images []string) error {
	if warm, ok := l.Serving.pod(node); ok && warm.runtime {
		if _, err := l.call(ctx, warm, http.MethodPost, pullPath, pullRequest{Images: images}); err == nil {
			return nil
		}
		// The kubelet pulls with the pod's pull secrets and the node's
		// credential providers, which the runtime alone may lack.
	}
	_, err := l.runPod(ctx, l.PullerSpec(podName, node, images))
	return err
}

// PullerSpec is the pod that makes node pull images: in the application's
// namespace, with its pull secrets, and nothing a restricted Pod Security
// level forbids (it only runs the agent binary's noop).
func (l Launcher) PullerSpec(podName, node string, images []string) *corev1.Pod {
	restricted := Restricted()
	mount := []corev1.VolumeMount{{Name: "agent-bin", MountPath: "/kubectl-migrate"}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: l.appNamespace(), Labels: l.Labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			ImagePullSecrets:              l.PullSecrets,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Volumes:                       []corev1.Volume{{Name: "agent-bin", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			InitContainers: []corev1.Container{{
				Name: "install-agent", Image: l.Image, ImagePullPolicy: corev1.PullIfNotPresent,
				Args: []string{"install", "/kubectl-migrate"}, VolumeMounts: mount, SecurityContext: restricted,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	for i, img := range images {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
			Name: fmt.Sprintf("pull-%d", i), Image: img, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"/kubectl-migrate/kubectl-migrate-agent", "noop"}, VolumeMounts: mount,
			SecurityContext: restricted, TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		})
	}
	return pod
}

// Restricted is a container's security context that no Pod Security level
// refuses, for the agent binary's noop wherever it runs in an application's
// namespace.
func Restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsUser: ptr.To[int64](65534), RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// appNamespace is where the migrated pod lives.
func (l Launcher) appNamespace() string { return cmp.Or(l.AppNamespace, l.Namespace) }

// CreateInNamespace creates an object in the agents' namespace with
// create, first creating the namespace if create found it missing.
func CreateInNamespace(ctx context.Context, client kubernetes.Interface, namespace string, create func() error) error {
	err := create()
	if !apierrors.IsNotFound(err) {
		return err
	}
	if nerr := EnsureNamespace(ctx, client, namespace); nerr != nil {
		return fmt.Errorf("the agents' namespace %s does not exist and creating it failed (%w); have an administrator run kubectl migrate node-setup, which creates it, or pass --agent-namespace", namespace, nerr)
	}
	return create()
}

// EnsureNamespace creates the agents' namespace, labelled as the
// project's, with the Pod Security level agents need, unless it exists.
func EnsureNamespace(ctx context.Context, client kubernetes.Interface, namespace string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{
		kube.ManagedByLabel: kube.ManagedBy,
		// Root and host paths: see DefaultNamespace.
		"pod-security.kubernetes.io/enforce": "privileged",
	}}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// requestTimeout bounds the wait for the controller to create a requested
// agent's pod (it takes milliseconds).
const requestTimeout = 30 * time.Second

// requestAgent asks the agents' controller for the agent pod name that
// req describes, with a copy of RegistrySecret's docker config, and waits
// until the pod exists.
func (l Launcher) requestAgent(ctx context.Context, name string, req AgentRequest, controlToken, directToken string) error {
	var dockerConfig []byte
	if l.RegistrySecret != "" {
		src, err := l.Client.CoreV1().Secrets(l.appNamespace()).Get(ctx, l.RegistrySecret, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read registry secret %s, which the agents push with: %w", l.RegistrySecret, err)
		}
		dockerConfig = src.Data[corev1.DockerConfigJsonKey]
	}
	s, err := RequestSecret(name, l.Namespace, l.appNamespace(), l.Labels, req, controlToken, directToken, dockerConfig)
	if err != nil {
		return err
	}
	if _, err := l.Client.CoreV1().Secrets(l.Namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("ask for the agent on %s: the agents' namespace %s does not exist; have an administrator run kubectl migrate node-setup, which installs the agents' controller there", req.Node, l.Namespace)
		}
		return fmt.Errorf("ask for the agent on %s: %w", req.Node, err)
	}
	tries := 0
	poll, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	err = wait.PollUntilContextCancel(poll, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := l.Client.CoreV1().Pods(l.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return true, nil
		}
		if !apierrors.IsNotFound(err) && poll.Err() == nil {
			return false, err
		}
		if tries++; tries%10 == 0 {
			return false, l.refusal(ctx, name)
		}
		return false, nil
	})
	if err != nil && ctx.Err() == nil {
		if rerr := l.refusal(ctx, name); rerr != nil {
			err = rerr
		} else if poll.Err() != nil {
			err = fmt.Errorf("the agents' controller did not start the agent on %s within %s: have an administrator check it runs (kubectl -n %s logs deployment/%s) or install it (kubectl migrate node-setup --agents-only)", req.Node, requestTimeout, l.Namespace, ControllerName)
		}
		_ = l.End(context.WithoutCancel(ctx), name)
	}
	return err
}

// refusal is the controller's reason for not serving request name, if it
// gave one.
func (l Launcher) refusal(ctx context.Context, name string) error {
	events, err := l.Client.CoreV1().Events(l.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.kind": "Secret", "involvedObject.name": name, "reason": "Refused",
	}.String()})
	if err != nil || len(events.Items) == 0 {
		return nil
	}
	return fmt.Errorf("the agents' controller refused: %s", events.Items[0].Message)
}

// End ends agent name of this launcher's migration for good: it deletes
// request name, which deletes its pod, and waits until the pod is gone. A
// pod that no request owns (node-setup's, which an administrator creates)
// is deleted by who may.
func (l Launcher) End(ctx context.Context, name string) error {
	err := l.Client.CoreV1().Secrets(l.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete agent request %s: %w", name, err)
	}
	if apierrors.IsNotFound(err) {
		err := l.Client.CoreV1().Pods(l.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return fmt.Errorf("delete agent pod %s: %w", name, err)
		}
	}
	_, err = kube.WaitForPod(ctx, l.Client, l.Namespace, name, kube.Gone)
	return err
}

// Runtime asks node's warm agent what the node's runtime says of itself.
func (l Launcher) Runtime(ctx context.Context, node string) (RuntimeInfo, error) {
	warm, ok := l.Serving.pod(node)
	if !ok || !warm.runtime {
		return RuntimeInfo{}, fmt.Errorf("no agent on %s reaches its runtime", node)
	}
	out, err := l.call(ctx, warm, http.MethodPost, runtimePath, struct{}{})
	if err != nil {
		return RuntimeInfo{}, err
	}
	return decodeAnswer[RuntimeInfo](node, out)
}

// Expect has node's receiving agent (started with WarmOptions.Stage) mark
// the checkpoints of ids as on their way (ExpectedPath).
func (l Launcher) Expect(ctx context.Context, node string, ids []ociruntime.Identity) error {
	return l.tellReceiver(ctx, node, expectPath, expectRequest{Containers: ids})
}

// Bind has node's receiving agent give the checkpoints staged for ids
// before their pod existed to that pod, whose UID each id carries: only
// its containers restore them.
func (l Launcher) Bind(ctx context.Context, node string, ids []ociruntime.Identity) error {
	return l.tellReceiver(ctx, node, bindPath, bindRequest{Containers: ids})
}

// tellReceiver posts req to path of node's warm receiving agent.
func (l Launcher) tellReceiver(ctx context.Context, node, path string, req any) error {
	warm, ok := l.Serving.pod(node)
	if !ok {
		return fmt.Errorf("no agent on %s receives checkpoints", node)
	}
	_, err := l.call(ctx, warm, http.MethodPost, path, req)
	return err
}

// DirectCert asks node's warm direct-transfer agent for the fingerprint of
// the certificate its sender must pin. The answer comes through the API
// server, not over the network the archive crosses.
func (l Launcher) DirectCert(ctx context.Context, node string) (string, error) {
	warm, ok := l.Serving.pod(node)
	if !ok {
		return "", fmt.Errorf("no agent on %s receives the checkpoint", node)
	}
	out, err := l.call(ctx, warm, http.MethodPost, directPath, struct{}{})
	if err != nil {
		return "", err
	}
	info, err := decodeAnswer[DirectInfo](node, out)
	if err == nil && info.CertSHA256 == "" {
		err = fmt.Errorf("the agent on %s has no certificate to receive with", node)
	}
	return info.CertSHA256, err
}

// decodeAnswer decodes a serving agent's JSON answer.
func decodeAnswer[T any](node string, out []byte) (T, error) {
	var res T
	if err := json.Unmarshal(out, &res); err != nil {
		return res, fmt.Errorf("agent on %s answered %q: %w", node, out, err)
	}
	return res, nil
}

// runRequested requests a one-shot agent, waits for it to finish and
// ends it, returning its termination message.
func (l Launcher) runRequested(ctx context.Context, name string, req AgentRequest) (string, error) {
	if err := l.requestAgent(ctx, name, req, "", ""); err != nil {
		return "", err
	}
	// The agent goes away whatever happens, even if ctx was cancelled.
	defer func() { _ = l.End(context.WithoutCancel(ctx), name) }()
	return l.finished(ctx, l.Namespace, name, req.Node)
}

// runPod creates pod itself (a puller in the application's namespace, or
// node-setup's pod, an administrator's), waits for it to finish and
// deletes it.
func (l Launcher) runPod(ctx context.Context, pod *corev1.Pod) (string, error) {
	podName, node, ns := pod.Name, pod.Spec.NodeName, pod.Namespace
	if _, err := l.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create pod %s on %s: %w", podName, node, err)
	}
	// The pod goes away whatever happens, even if ctx was cancelled.
	defer func() {
		_ = kube.DeleteAndWait(context.WithoutCancel(ctx), l.Client, ns, podName, ptr.To[int64](0))
	}()
	return l.finished(ctx, ns, podName, node)
}

// finished waits for an agent pod to end and returns its termination
// message, or why it failed.
func (l Launcher) finished(ctx context.Context, ns, podName, node string) (string, error) {
	pod, err := kube.WaitForPod(ctx, l.Client, ns, podName, agentFinished(l.Image))
	if err != nil {
		return "", err
	}
	msg := terminationMessage(pod)
	if pod.Status.Phase != corev1.PodSucceeded {
		return "", fmt.Errorf("agent on %s failed: %s", node, msg)
	}
	return msg, nil
}

func agentFinished(image string) kube.PodCondition {
	return func(pod *corev1.Pod) (bool, error) {
		if pod == nil {
			return false, errors.New("agent pod was deleted before it finished")
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded, corev1.PodFailed:
			return true, nil
		}
		for _, cs := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
			w := cs.State.Waiting
			switch {
			case kube.PullFailed(w) && (cs.Name == "agent" || cs.Name == "install-agent"):
				return false, fmt.Errorf("the node cannot pull the agent image %s (%s); push it where the nodes can pull it and pass --agent-image", image, strings.TrimSpace(w.Message))
			case kube.PullFailed(w):
				return false, fmt.Errorf("node %s cannot pull image %s (%s)", pod.Spec.NodeName, specImage(pod, cs.Name), strings.TrimSpace(w.Message))
			case kube.StartFailed(w):
				return false, fmt.Errorf("agent container %s on %s cannot start: %s: %s", cs.Name, pod.Spec.NodeName, w.Reason, strings.TrimSpace(w.Message))
			}
		}
		return false, nil
	}
}

func specImage(pod *corev1.Pod, container string) string {
	for _, c := range pod.Spec.Containers {
		if c.Name == container {
			return c.Image
		}
	}
	return container
}

func terminationMessage(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			if t.Message != "" {
				return strings.TrimSpace(t.Message)
			}
			return fmt.Sprintf("exit code %d (%s)", t.ExitCode, t.Reason)
		}
	}
	return "no termination message"
}

// PodSpec returns an agent pod that an administrator's command creates
// itself (node-setup's): in the agents' namespace, pinned to node, root, the
// kubelet's checkpoint directory mounted.
func (l Launcher) PodSpec(podName, node string, args []string) *corev1.Pod {
	return basePod(podName, l.Namespace, node, l.Image, args, l.Labels)
}
