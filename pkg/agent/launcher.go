package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
)

// Paths inside the agent container.
const (
	registryConfigDir = "/var/run/kubectl-migrate/registry"
	checkpointVolume  = "checkpoints"
	registryVolume    = "registry-auth"
)

// Launcher runs the agent in short-lived pods.
type Launcher struct {
	Client kubernetes.Interface
	// Image is the agent image; the target nodes must be able to pull it.
	Image     string
	Namespace string
	// RegistrySecret is a kubernetes.io/dockerconfigjson secret in Namespace
	// that the agent pushes with; empty for an anonymous registry.
	RegistrySecret string
	PullSecrets    []corev1.LocalObjectReference
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
		var res PackResult
		if err := json.Unmarshal(out, &res); err != nil {
			return PackResult{}, fmt.Errorf("agent %s answered %q: %w", warm.pod, out, err)
		}
		return res, nil
	}
	if req.isDirect() {
		return PackResult{}, fmt.Errorf("a transfer without a registry needs the warm agent on %s, which is gone; run the migration again", node)
	}
	args := []string{"pack", "--archive", req.Archive, "--container", req.Container, "--image", req.Image}
	if req.Insecure {
		args = append(args, "--insecure")
	}
	if req.KeepArchive {
		args = append(args, "--keep-archive")
	}
	msg, err := l.run(ctx, podName, node, args)
	if err != nil {
		return PackResult{}, err
	}
	var res PackResult
	if err := json.Unmarshal([]byte(msg), &res); err != nil {
		return PackResult{}, fmt.Errorf("agent reported %q: %w", msg, err)
	}
	return res, nil
}

// Remove deletes checkpoint archives on node (through its warm agent if it
// has one).
func (l Launcher) Remove(ctx context.Context, podName, node string, archives []string) error {
	if warm, ok := l.Serving.pod(node); ok {
		_, err := l.call(ctx, warm, http.MethodPost, removePath, removeRequest{Archives: archives})
		return err
	}
	_, err := l.run(ctx, podName, node, append([]string{"remove"}, archives...))
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
	pod := l.PodSpec(podName, node, nil)
	pod.Spec.Volumes = []corev1.Volume{{Name: "agent-bin", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	mount := []corev1.VolumeMount{{Name: "agent-bin", MountPath: "/kubectl-migrate"}}
	install := pod.Spec.Containers[0]
	install.Name, install.Args, install.Env, install.VolumeMounts = "install-agent", []string{"install", "/kubectl-migrate"}, nil, mount
	pod.Spec.InitContainers = []corev1.Container{install}
	pod.Spec.Containers = nil
	for i, img := range images {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{
			Name: fmt.Sprintf("pull-%d", i), Image: img, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"/kubectl-migrate/kubectl-migrate-agent", "noop"}, VolumeMounts: mount,
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		})
	}
	_, err := l.runPod(ctx, pod)
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

// decodeAnswer decodes a serving agent's JSON answer.
func decodeAnswer[T any](node string, out []byte) (T, error) {
	var res T
	if err := json.Unmarshal(out, &res); err != nil {
		return res, fmt.Errorf("agent on %s answered %q: %w", node, out, err)
	}
	return res, nil
}

// run creates the agent pod, waits for it to finish and deletes it, returning
// its termination message.
func (l Launcher) run(ctx context.Context, podName, node string, args []string) (string, error) {
	return l.runPod(ctx, l.PodSpec(podName, node, args))
}

func (l Launcher) runPod(ctx context.Context, pod *corev1.Pod) (string, error) {
	podName, node := pod.Name, pod.Spec.NodeName
	if _, err := l.Client.CoreV1().Pods(l.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create agent pod on %s: %w", node, err)
	}
	// The agent pod goes away whatever happens, even if ctx was cancelled.
	defer func() {
		_ = kube.DeleteAndWait(context.WithoutCancel(ctx), l.Client, l.Namespace, podName, ptr.To[int64](0))
	}()
	pod, err := kube.WaitForPod(ctx, l.Client, l.Namespace, podName, agentFinished(l.Image))
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

// PodSpec returns the agent pod: pinned to node, root, the kubelet's
// checkpoint directory mounted, the registry secret as a docker config.
func (l Launcher) PodSpec(podName, node string, args []string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: l.Namespace, Labels: l.Labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			ImagePullSecrets:              l.PullSecrets,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name:                     "agent",
				Image:                    l.Image,
				Args:                     args,
				ImagePullPolicy:          corev1.PullIfNotPresent,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				SecurityContext:          &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)},
				VolumeMounts:             []corev1.VolumeMount{{Name: checkpointVolume, MountPath: CheckpointDir}},
			}},
			Volumes: []corev1.Volume{{
				Name: checkpointVolume,
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
					Path: CheckpointDir, Type: ptr.To(corev1.HostPathDirectory),
				}},
			}},
		},
	}
	if l.RegistrySecret != "" {
		c := &pod.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: "DOCKER_CONFIG", Value: registryConfigDir})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: registryVolume, MountPath: registryConfigDir, ReadOnly: true})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name: registryVolume,
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: l.RegistrySecret,
				Items:      []corev1.KeyToPath{{Key: corev1.DockerConfigJsonKey, Path: "config.json"}},
			}},
		})
	}
	return pod
}
