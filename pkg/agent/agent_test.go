package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/test/testenv"
)

func TestValidateArchiveRefusesPathsOutsideTheCheckpointDir(t *testing.T) {
	for _, p := range []string{"/etc/shadow", CheckpointDir + "/../../../etc/passwd.tar", "relative.tar", CheckpointDir + "/x.img"} {
		if ValidateArchive(p) == nil {
			t.Errorf("%s accepted", p)
		}
	}
	if err := ValidateArchive(CheckpointDir + "/checkpoint-a_b-c-2026.tar"); err != nil {
		t.Error(err)
	}
}

func TestPackPushesAndDeletesTheArchive(t *testing.T) {
	host := testenv.Registry(t)
	archiveDir = t.TempDir()
	t.Cleanup(func() { archiveDir = CheckpointDir })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "config.dump", Mode: 0o600, Size: 2, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("{}"))
	_ = tw.Close()
	archive := filepath.Join(archiveDir, "checkpoint-p_ns-app-1.tar")
	if err := os.WriteFile(archive, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	reg := image.Registry{Insecure: true}
	res, err := Pack(context.Background(), PackRequest{Archive: archive, Container: "app", Image: host + "/" + testenv.Name("agent") + ":app-1", Insecure: true}, reg)
	if err != nil {
		t.Fatal(err)
	}
	if res.ArchiveBytes != int64(buf.Len()) || !strings.Contains(res.Image, "@sha256:") {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Fatal("archive still on the node after pushing")
	}
	img, err := reg.Pull(context.Background(), res.Image)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := img.Manifest()
	if m.Annotations[image.CRIOCheckpointAnnotation] != "app" {
		t.Fatalf("annotations %v", m.Annotations)
	}
}

// runAgentPods plays the kubelet for agent pods: each ends with phase and
// message.
func runAgentPods(t *testing.T, client *fake.Clientset, phase corev1.PodPhase, message string, waiting string) {
	runAgentPodsIn(t, client, "ns", phase, message, waiting)
}

func runAgentPodsIn(t *testing.T, client *fake.Clientset, ns string, phase corev1.PodPhase, message string, waiting string) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if ev.Type != watch.Added || !ok {
				continue
			}
			state := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Message: message}}
			if waiting != "" {
				state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: waiting, Message: "not found"}}
			} else {
				pod.Status.Phase = phase
			}
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "agent", State: state}}
			_, _ = client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		}
	}()
}

// serveRequests runs the agents' controller on client's namespace ns, as
// node-setup installs it, with image agent:1.
func serveRequests(t *testing.T, client *fake.Clientset, ns string) {
	// The fake API server has no garbage collector: play it for the pods
	// requests own. Added before the controller runs: the fake's reactor
	// list is not safe to change while it is called.
	client.PrependReactor("delete", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		_ = client.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), a.GetNamespace(), a.(k8stesting.DeleteAction).GetName())
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	c := Controller{Client: client, Namespace: ns, Image: "agent:1",
		PolicySince: func(context.Context) (time.Time, error) { return time.Time{}, nil }}
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func regcred(ns string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: ns},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`), "other": []byte("not copied")},
	}
}

func TestLauncherPack(t *testing.T) {
	client := fake.NewClientset(regcred("ns"))
	serveRequests(t, client, "ns")
	want := PackResult{Image: "reg/p@sha256:1", ArchiveBytes: 10}
	msg, _ := json.Marshal(want)
	runAgentPods(t, client, corev1.PodSucceeded, string(msg), "")
	l := Launcher{Client: client, Image: "agent:1", Namespace: "ns", RegistrySecret: "regcred"}
	got, err := l.Pack(context.Background(), "agent-x-a", "node-a", PackRequest{Archive: CheckpointDir + "/c.tar", Container: "app", Image: "reg/p:app-x"})
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("got %+v", got)
	}
	if _, err := client.CoreV1().Pods("ns").Get(context.Background(), "agent-x-a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatal("agent pod not deleted after it finished")
	}
}

func TestLauncherReportsFailures(t *testing.T) {
	for _, tc := range []struct {
		name, waiting, want string
		phase               corev1.PodPhase
	}{
		{"agent error", "", "error: push refused", corev1.PodFailed},
		{"image pull", "ErrImagePull", "cannot pull the agent image agent:1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			serveRequests(t, client, "ns")
			runAgentPods(t, client, tc.phase, "error: push refused", tc.waiting)
			l := Launcher{Client: client, Image: "agent:1", Namespace: "ns"}
			_, err := l.Pack(context.Background(), "agent-y-a", "node-a", PackRequest{Archive: CheckpointDir + "/c.tar", Container: "app", Image: "reg/p:x"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestRequestedPod: the controller builds from a request only what the
// request may name; its tokens reach the pod from the request, never as
// values anyone reading pods sees.
func TestRequestedPod(t *testing.T) {
	req := AgentRequest{Node: "node-a", Image: "agent:1", Command: commandServe, Direct: true, Stage: true, RuntimeSocket: "/run/crio/crio.sock", Volumes: true}
	s, err := RequestSecret("agent-z", "agents", "shop", map[string]string{"migration": "z"}, req, "control", "push", []byte(`{"auths":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	s.UID = "uid-z"
	parsed, ns, err := ParseRequest(s)
	if err != nil || ns != "shop" || parsed.Validate("agent:1") != nil {
		t.Fatalf("parsed %+v %s: %v", parsed, ns, err)
	}
	pod := RequestedPod(s, parsed, ns)
	if pod.Spec.NodeName != "node-a" || pod.Namespace != "agents" || pod.OwnerReferences[0].UID != "uid-z" || !pod.Spec.HostNetwork {
		t.Fatalf("pod %+v", pod.ObjectMeta)
	}
	paths := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			paths[v.HostPath.Path] = true
		}
		if v.Secret != nil && v.Secret.SecretName != "agent-z" {
			t.Errorf("mounts secret %s", v.Secret.SecretName)
		}
	}
	for _, p := range []string{CheckpointDir, "/run/crio/crio.sock", PodsDir, ociruntime.StageDir} {
		if !paths[p] {
			t.Errorf("no %s in %v", p, paths)
		}
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if env[AppNamespaceEnv].Value != "shop" || len(env) != 2 || env["DOCKER_CONFIG"].Value != registryConfigDir {
		t.Fatalf("env %+v", env)
	}
	var tokens []string
	for _, v := range pod.Spec.Volumes {
		if v.Name == "request" {
			for _, item := range v.Secret.Items {
				tokens = append(tokens, item.Key)
			}
		}
	}
	if strings.Join(tokens, ",") != controlTokenKey+","+directTokenKey {
		t.Fatalf("tokens from the request: %v", tokens)
	}

	pack := AgentRequest{Node: "node-a", Image: "agent:1", Command: commandPack, Args: []string{"--archive", CheckpointDir + "/c.tar"}}
	ps, _ := RequestSecret("agent-p", "agents", "shop", nil, pack, "", "", nil)
	pp := RequestedPod(ps, pack, "shop")
	if len(pp.Spec.Volumes) != 1 || pp.Spec.HostNetwork || len(pp.Spec.Containers[0].Ports) != 0 {
		t.Fatalf("a pack gets more than the checkpoint directory: %+v", pp.Spec)
	}

	for _, bad := range []AgentRequest{
		{Node: "node-a", Image: "evil:1", Command: commandServe},
		{Node: "node-a", Image: "agent:1", Command: "node-setup"},
		{Node: "node-a", Image: "agent:1", Command: commandServe, RuntimeSocket: "/etc/shadow"},
		{Node: "node-a", Image: "agent:1", Command: commandServe, RuntimeSocket: "/run/../etc/x.sock"},
		{Node: "node-a", Image: "agent:1", Command: commandPack, Volumes: true},
		{Node: "node-a", Image: "agent:1", Command: commandPack, Args: []string{"--direct", "/"}},
		{Node: "node-a", Image: "agent:1", Command: commandServe, Stage: true},
		{Image: "agent:1", Command: commandServe},
	} {
		if bad.Validate("agent:1") == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// clusterWithNamespaces makes creating anything in a namespace that does
// not exist fail as the API server does, and creating namespace deny fail
// as RBAC does.
func clusterWithNamespaces(t *testing.T, deny bool, objects ...runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objects...)
	client.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetResource().Resource == "namespaces" {
			if deny {
				return true, nil, apierrors.NewForbidden(corev1.Resource("namespaces"), "", errors.New("not allowed"))
			}
			return false, nil, nil
		}
		if _, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("namespaces"), "", a.GetNamespace()); err != nil {
			return true, nil, apierrors.NewNotFound(corev1.Resource("namespaces"), a.GetNamespace())
		}
		return false, nil, nil
	})
	return client
}

// TestAgentsRunInTheirOwnNamespace: the launcher creates no agent pod: it
// requests each in the agents' namespace, with the registry secret's docker
// config alone, and the controller creates the pod; Release deletes the
// requests and so the pods. The pods that pull the application's images
// run in its namespace with nothing a restricted Pod Security level
// forbids.
func TestAgentsRunInTheirOwnNamespace(t *testing.T) {
	ctx := context.Background()
	client := clusterWithNamespaces(t, false, regcred("app"), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace}})
	var requested *corev1.Secret
	client.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		requested = a.(k8stesting.CreateAction).GetObject().(*corev1.Secret).DeepCopy()
		return false, nil, nil
	})
	serveRequests(t, client, DefaultNamespace)
	msg, _ := json.Marshal(PackResult{Image: "reg/p@sha256:1"})
	runAgentPodsIn(t, client, DefaultNamespace, corev1.PodSucceeded, string(msg), "")
	labels := map[string]string{"migration": "abcde"}
	l := Launcher{Client: client, Image: "agent:1", Namespace: DefaultNamespace, AppNamespace: "app", ID: "abcde", RegistrySecret: "regcred", Labels: labels, Serving: &Serving{}}
	if _, err := l.Pack(ctx, "agent-abcde-a", "node-a", PackRequest{Archive: CheckpointDir + "/c.tar", Container: "app", Image: "reg/p:x"}); err != nil {
		t.Fatal(err)
	}
	if requested == nil || requested.Namespace != DefaultNamespace || requested.Type != RequestType || requested.Labels[RequestNamespaceLabel] != "app" ||
		string(requested.Data[corev1.DockerConfigJsonKey]) != `{"auths":{}}` || requested.Data["other"] != nil || requested.Labels["migration"] != "abcde" {
		t.Fatalf("request %+v", requested)
	}
	if _, err := client.CoreV1().Secrets(DefaultNamespace).Get(ctx, "agent-abcde-a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the one-shot agent's request outlived it: %v", err)
	}

	puller := l.PullerSpec("pull-abcde", "node-b", []string{"app:1", "sidecar:2"})
	if puller.Namespace != "app" || puller.Spec.Containers[0].Image != "app:1" {
		t.Fatalf("puller %s/%s", puller.Namespace, puller.Name)
	}
	for _, c := range append(puller.Spec.InitContainers, puller.Spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil || !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || sc.Capabilities.Drop[0] != "ALL" || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Fatalf("container %s is not restricted: %+v", c.Name, sc)
		}
	}
	for _, v := range puller.Spec.Volumes {
		if v.HostPath != nil {
			t.Fatalf("the puller mounts %s", v.HostPath.Path)
		}
	}

	// A process that died left an agent and a puller; Release finds both.
	for _, ns := range []string{DefaultNamespace, "app"} {
		left := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "left", Namespace: ns, Labels: labels}}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, left, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{DefaultNamespace, "app"} {
		if pods, _ := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
			t.Errorf("pods left in %s: %d", ns, len(pods.Items))
		}
	}
	if _, err := client.CoreV1().Secrets("app").Get(ctx, "regcred", metav1.GetOptions{}); err != nil {
		t.Errorf("the application's own secret: %v", err)
	}
}

// TestAMissingAgentNamespaceOneMayNotCreate: the error names the command
// that creates it.
func TestAMissingAgentNamespaceOneMayNotCreate(t *testing.T) {
	client := clusterWithNamespaces(t, true)
	l := Launcher{Client: client, Image: "agent:1", Namespace: DefaultNamespace, AppNamespace: "app", Serving: &Serving{}}
	err := l.Warm(context.Background(), "agent-x", "node-a", WarmOptions{})
	if err == nil || !strings.Contains(err.Error(), "node-setup") {
		t.Fatalf("got %v", err)
	}
	if pods, _ := client.CoreV1().Pods(DefaultNamespace).List(context.Background(), metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Fatal("an agent pod was created")
	}
}
