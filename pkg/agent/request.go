package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// A migration never creates its agents' pods: it asks for them with an
// agent request, a Secret of RequestType in the agents' namespace, and the
// agents' controller (RunController, installed by node-setup) builds each
// pod from the request alone (RequestedPod). Whoever migrates can so choose
// a node, a command and which node paths of a fixed few it needs, and
// nothing else: no image, no host path, no privilege of their own. An
// admission policy (node-setup's) admits a request only from who may
// migrate in the namespace it names, and the agent acts only on that
// namespace's pods (AppNamespaceEnv). The tokens travel in the request,
// which those who migrate may create but never read back.
const (
	// RequestType is the Secret type of agent requests.
	RequestType corev1.SecretType = "kubectl-migrate.io/agent-request"
	// RequestNamespaceLabel names the application namespace a request acts
	// for: the admission policy checks the requester may migrate there.
	RequestNamespaceLabel = "kubectl-migrate.io/namespace"
	// AppNamespaceEnv tells an agent the one namespace whose pods it may
	// touch, from its request's RequestNamespaceLabel.
	AppNamespaceEnv = "KUBECTL_MIGRATE_NAMESPACE"

	// RequestDir is where an agent finds its request's tokens.
	RequestDir = "/var/run/kubectl-migrate/request"

	requestKey      = "request"
	controlTokenKey = "control-token"
	directTokenKey  = "direct-token"
)

// Commands an agent request may run.
const (
	commandServe  = "serve"
	commandPack   = "pack"
	commandRemove = "remove"
)

// AgentRequest is everything a migration may ask of an agent pod.
type AgentRequest struct {
	Node string `json:"node"`
	// Image must be the controller's own: it is the administrator's choice,
	// and a request asking for another is refused, not silently changed.
	Image   string   `json:"image"`
	Command string   `json:"command"`
	Args    []string `json:"args,omitempty"`
	// Serving agents (Command serve) only:
	Direct        bool   `json:"direct,omitempty"`
	Stage         bool   `json:"stage,omitempty"`
	RuntimeSocket string `json:"runtimeSocket,omitempty"`
	Volumes       bool   `json:"volumes,omitempty"`
	Fence         bool   `json:"fence,omitempty"`
	// MountStage gives a remove the node's stage (staged checkpoints).
	MountStage bool `json:"mountStage,omitempty"`
}

// Validate refuses what no migration asks for. image is the controller's.
func (r AgentRequest) Validate(image string) error {
	switch {
	case r.Node == "":
		return fmt.Errorf("no node")
	case r.Image != image:
		return fmt.Errorf("image %s is not the agents' image %s, which the administrator installed (kubectl migrate node-setup --agent-image); pass --agent-image %s or leave it out", r.Image, image, image)
	case !slices.Contains([]string{commandServe, commandPack, commandRemove}, r.Command):
		return fmt.Errorf("command %q is none of serve, pack, remove", r.Command)
	case r.Command == commandServe && len(r.Args) > 0:
		return fmt.Errorf("serve takes no arguments")
	case r.Command != commandServe && (r.Direct || r.Stage || r.RuntimeSocket != "" || r.Volumes || r.Fence):
		return fmt.Errorf("only serve takes serving options")
	case r.Command != commandRemove && r.MountStage:
		return fmt.Errorf("only remove mounts the stage")
	case r.Stage && !r.Direct:
		return fmt.Errorf("stage needs direct")
	case r.Fence && r.RuntimeSocket == "":
		return fmt.Errorf("fence needs the runtime socket, which finds a pod's network namespace")
	case r.RuntimeSocket != "" && (!filepath.IsAbs(r.RuntimeSocket) || filepath.Clean(r.RuntimeSocket) != r.RuntimeSocket || !strings.HasSuffix(r.RuntimeSocket, ".sock")):
		return fmt.Errorf("runtime socket %q is not an absolute, clean path to a .sock", r.RuntimeSocket)
	}
	for _, a := range r.Args {
		if strings.HasPrefix(a, "--") && r.Command == commandPack && !slices.Contains([]string{"--archive", "--container", "--image", "--insecure", "--keep-archive"}, strings.SplitN(a, "=", 2)[0]) {
			return fmt.Errorf("pack takes no %s", a)
		}
	}
	return nil
}

// RequestSecret is the request named name (its pod's name too) for
// appNamespace, carrying the tokens and the registry's docker config
// (dockerConfig, nil for none).
func RequestSecret(name, agentsNamespace, appNamespace string, labels map[string]string, req AgentRequest, controlToken, directToken string, dockerConfig []byte) (*corev1.Secret, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	l := map[string]string{RequestNamespaceLabel: appNamespace}
	for k, v := range labels {
		l[k] = v
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: agentsNamespace, Labels: l},
		Type:       RequestType,
		Immutable:  ptr.To(true),
		Data:       map[string][]byte{requestKey: body},
	}
	if controlToken != "" {
		s.Data[controlTokenKey] = []byte(controlToken)
	}
	if directToken != "" {
		s.Data[directTokenKey] = []byte(directToken)
	}
	if dockerConfig != nil {
		s.Data[corev1.DockerConfigJsonKey] = dockerConfig
	}
	return s, nil
}

// ParseRequest reads a request Secret.
func ParseRequest(s *corev1.Secret) (AgentRequest, string, error) {
	var req AgentRequest
	if s.Type != RequestType {
		return req, "", fmt.Errorf("secret %s is a %s, not an agent request", s.Name, s.Type)
	}
	ns := s.Labels[RequestNamespaceLabel]
	if ns == "" {
		return req, "", fmt.Errorf("request %s names no namespace (label %s)", s.Name, RequestNamespaceLabel)
	}
	if err := json.Unmarshal(s.Data[requestKey], &req); err != nil {
		return req, "", fmt.Errorf("request %s: %w", s.Name, err)
	}
	if req.Direct && len(s.Data[directTokenKey]) == 0 {
		return req, "", fmt.Errorf("request %s asks for a direct transfer's agent without its push token", s.Name)
	}
	return req, ns, nil
}

// RequestedPod is the one pod the controller builds for request s (parsed
// as req, for appNamespace): the agent image, the kubelet's checkpoint
// directory, and only the node paths req names, owned by s so that
// deleting the request deletes the pod.
func RequestedPod(s *corev1.Secret, req AgentRequest, appNamespace string) *corev1.Pod {
	args := append([]string{req.Command}, req.Args...)
	pod := basePod(s.Name, s.Namespace, req.Node, req.Image, args, s.Labels)
	pod.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "Secret", Name: s.Name, UID: s.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: AppNamespaceEnv, Value: appNamespace})
	// The tokens as files of the request, not variables: the kubelet waits
	// for a volume's secret, where a variable's not yet readable fails the
	// container.
	var tokens []corev1.KeyToPath
	for _, key := range []string{controlTokenKey, directTokenKey} {
		if _, ok := s.Data[key]; ok {
			tokens = append(tokens, corev1.KeyToPath{Key: key, Path: key})
		}
	}
	if len(tokens) > 0 {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "request", MountPath: RequestDir, ReadOnly: true})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "request", VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: s.Name, Items: tokens, DefaultMode: ptr.To[int32](0o400)},
		}})
	}
	if _, ok := s.Data[corev1.DockerConfigJsonKey]; ok {
		c.Env = append(c.Env, corev1.EnvVar{Name: "DOCKER_CONFIG", Value: registryConfigDir})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: registryVolume, MountPath: registryConfigDir, ReadOnly: true})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name: registryVolume,
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: s.Name,
				Items:      []corev1.KeyToPath{{Key: corev1.DockerConfigJsonKey, Path: "config.json"}},
			}},
		})
	}
	if req.MountStage {
		mountStage(pod)
	}
	if req.Command != commandServe {
		return pod
	}
	port := ServePort
	if req.Direct {
		port = DirectPort
		directPod(pod)
		if req.Stage {
			c.Args = append(c.Args, "--stage", ociruntime.StageDir)
			mountStage(pod)
		}
	}
	if req.RuntimeSocket != "" {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "cri", MountPath: runtimeSocketPath})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "cri", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: req.RuntimeSocket, Type: ptr.To(corev1.HostPathSocket)},
		}})
	}
	if req.Volumes {
		// HostToContainer: a medium: Memory emptyDir is a tmpfs the kubelet
		// mounts there, which the agent must see.
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "pods", MountPath: PodsDir, ReadOnly: true, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "pods", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: PodsDir, Type: ptr.To(corev1.HostPathDirectory)},
		}})
	}
	if req.Fence {
		fencingPod(pod)
	}
	c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: int32(port)})
	return pod
}

// fencingPod lets pod's agent fence pods (fencePath): it sees the network
// namespaces the runtime pins, including those pinned after it started,
// may enter them (SYS_ADMIN) and set their firewall (NET_ADMIN).
func fencingPod(pod *corev1.Pod) {
	c := &pod.Spec.Containers[0]
	c.SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "SYS_ADMIN"}}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "netns", MountPath: NetnsDir, ReadOnly: true, MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)})
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "netns", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: NetnsDir, Type: ptr.To(corev1.HostPathDirectory)},
	}})
}

// servePort is the port a serving agent of req answers on.
func (r AgentRequest) servePort() int {
	if r.Direct {
		return DirectPort
	}
	return ServePort
}

// basePod is every agent pod's: pinned to node, root, the kubelet's
// checkpoint directory mounted, no service account token.
func basePod(name, namespace, node, image string, args []string, labels map[string]string) *corev1.Pod {
	pod := nodePod(name, namespace, node, labels, corev1.Container{
		Name:                     "agent",
		Image:                    image,
		Args:                     args,
		ImagePullPolicy:          corev1.PullIfNotPresent,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext:          &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)},
		VolumeMounts:             []corev1.VolumeMount{{Name: checkpointVolume, MountPath: CheckpointDir}},
	})
	pod.Spec.Volumes = []corev1.Volume{{
		Name: checkpointVolume,
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: CheckpointDir, Type: ptr.To(corev1.HostPathDirectory),
		}},
	}}
	return pod
}

// nodePod runs c once on node, tolerating every taint (a migration goes
// where its pod is), with no service account token and no grace.
func nodePod(name, namespace, node string, labels map[string]string, c corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:                    []corev1.Container{c},
		},
	}
}

// Token is the agent's token that env names (ControlTokenEnv, TokenEnv):
// the variable if set, else the file of its request that carries it.
func Token(env string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	key := map[string]string{ControlTokenEnv: controlTokenKey, TokenEnv: directTokenKey}[env]
	b, err := os.ReadFile(filepath.Join(RequestDir, key))
	if key == "" || err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
