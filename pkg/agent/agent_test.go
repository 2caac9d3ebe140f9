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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
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

func TestLauncherPack(t *testing.T) {
	client := fake.NewClientset()
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
			runAgentPods(t, client, tc.phase, "error: push refused", tc.waiting)
			l := Launcher{Client: client, Image: "agent:1", Namespace: "ns"}
			_, err := l.Pack(context.Background(), "agent-y-a", "node-a", PackRequest{Archive: CheckpointDir + "/c.tar", Container: "app", Image: "reg/p:x"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestAgentPodSpec(t *testing.T) {
	l := Launcher{Image: "agent:1", Namespace: "ns", RegistrySecret: "regcred"}
	pod := l.PodSpec("agent-z", "node-a", []string{"remove", "/x.tar"})
	if pod.Spec.NodeName != "node-a" || pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Fatal("agent must be pinned to the source node and run once")
	}
	c := pod.Spec.Containers[0]
	var hostPath, secret bool
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path == CheckpointDir {
			hostPath = true
		}
		if v.Secret != nil && v.Secret.SecretName == "regcred" && v.Secret.Items[0].Key == corev1.DockerConfigJsonKey && v.Secret.Items[0].Path == "config.json" {
			secret = true
		}
	}
	if !hostPath || !secret {
		t.Fatalf("volumes %+v", pod.Spec.Volumes)
	}
	if c.Env[0].Name != "DOCKER_CONFIG" || c.Env[0].Value != registryConfigDir {
		t.Fatalf("env %+v", c.Env)
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

// TestAgentsRunInTheirOwnNamespace: the agents run in the agents'
// namespace, created (Pod Security privileged) when missing, with a copy
// of the application's registry secret that Release removes again; the
// pods that pull the application's images run in its namespace with
// nothing a restricted Pod Security level forbids.
func TestAgentsRunInTheirOwnNamespace(t *testing.T) {
	ctx := context.Background()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: "app"},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{}}`), "other": []byte("not copied")},
	}
	client := clusterWithNamespaces(t, false, secret, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}})
	msg, _ := json.Marshal(PackResult{Image: "reg/p@sha256:1"})
	runAgentPodsIn(t, client, DefaultNamespace, corev1.PodSucceeded, string(msg), "")
	var created []*corev1.Pod
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		created = append(created, a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy())
		return false, nil, nil
	})
	labels := map[string]string{"migration": "abcde"}
	l := Launcher{Client: client, Image: "agent:1", Namespace: DefaultNamespace, AppNamespace: "app", ID: "abcde", RegistrySecret: "regcred", Labels: labels}
	if _, err := l.Pack(ctx, "agent-abcde-a", "node-a", PackRequest{Archive: CheckpointDir + "/c.tar", Container: "app", Image: "reg/p:x"}); err != nil {
		t.Fatal(err)
	}
	ns, err := client.CoreV1().Namespaces().Get(ctx, DefaultNamespace, metav1.GetOptions{})
	if err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Fatalf("agents' namespace %+v (%v)", ns, err)
	}
	staged, err := client.CoreV1().Secrets(DefaultNamespace).Get(ctx, "kubectl-migrate-registry-abcde", metav1.GetOptions{})
	if err != nil || string(staged.Data[corev1.DockerConfigJsonKey]) != `{"auths":{}}` || len(staged.Data) != 1 || staged.Labels["migration"] != "abcde" {
		t.Fatalf("the agents' copy of the registry secret: %+v (%v)", staged, err)
	}
	if len(created) != 1 || created[0].Namespace != DefaultNamespace || created[0].Spec.Volumes[1].Secret.SecretName != staged.Name {
		t.Fatalf("agent pods created: %+v", created)
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
	if _, err := client.CoreV1().Secrets(DefaultNamespace).Get(ctx, staged.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the agents' copy of the registry secret outlived the migration: %v", err)
	}
	if _, err := client.CoreV1().Secrets("app").Get(ctx, "regcred", metav1.GetOptions{}); err != nil {
		t.Errorf("the application's own secret: %v", err)
	}
}

// TestAMissingAgentNamespaceOneMayNotCreate: the error names who creates
// it and the flag that picks another.
func TestAMissingAgentNamespaceOneMayNotCreate(t *testing.T) {
	client := clusterWithNamespaces(t, true)
	l := Launcher{Client: client, Image: "agent:1", Namespace: DefaultNamespace, AppNamespace: "app", Serving: &Serving{}}
	err := l.Warm(context.Background(), "agent-x", "node-a", WarmOptions{})
	if err == nil || !strings.Contains(err.Error(), "docs/rbac.yaml") || !strings.Contains(err.Error(), "--agent-namespace") {
		t.Fatalf("got %v", err)
	}
	if pods, _ := client.CoreV1().Pods(DefaultNamespace).List(context.Background(), metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Fatal("an agent pod was created")
	}
}
