package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

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
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := client.CoreV1().Pods("ns").Watch(ctx, metav1.ListOptions{})
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
			_, _ = client.CoreV1().Pods("ns").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
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
