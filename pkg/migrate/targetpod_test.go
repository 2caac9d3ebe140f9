package migrate

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
)

func TestTargetPod(t *testing.T) {
	t.Parallel()
	source := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "consumer", Namespace: "ns", Labels: map[string]string{"app": "c"},
			Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: "{}", "org.criu.config": "/etc/criu/x.conf"},
		},
		Spec: corev1.PodSpec{
			NodeName:         "node-a",
			NodeSelector:     map[string]string{"kubernetes.io/hostname": "node-a"},
			Affinity:         &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{}},
			ImagePullSecrets: []corev1.LocalObjectReference{{Name: "pull"}},
			Containers: []corev1.Container{
				{Name: "app", Image: "app:1", Command: []string{"/app"}, Env: []corev1.EnvVar{{Name: "A", Value: "1"}},
					Ports:        []corev1.ContainerPort{{ContainerPort: 8080}},
					VolumeMounts: []corev1.VolumeMount{{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets"}, {Name: "data", MountPath: "/data"}}},
				{Name: "sidecar", Image: "side:1", VolumeMounts: []corev1.VolumeMount{
					{Name: "cache", MountPath: "/cache"}, {Name: "kube-api-access-abcde", MountPath: "/var/run/secrets"}}},
			},
			Volumes: []corev1.Volume{{Name: "cache"}, {Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-consumer"}}},
				{Name: "kube-api-access-abcde"}, {Name: "unused"}},
		},
	}
	pod := targetPod(source, "consumer-x1", "node-b", "x1", map[string]string{"app": "reg/consumer@sha256:1"}, "regcred")

	if pod.Spec.NodeName != "node-b" || pod.Spec.NodeSelector != nil || pod.Spec.Affinity != nil {
		t.Fatal("target must be pinned to node-b with the source's scheduling constraints dropped")
	}
	if pod.Labels["app"] != "c" || pod.Labels[MigrationLabel] != "x1" {
		t.Fatalf("labels %v", pod.Labels)
	}
	if _, ok := pod.Annotations[corev1.LastAppliedConfigAnnotation]; ok || pod.Annotations["org.criu.config"] == "" ||
		pod.Annotations[MigratedFromAnnotation] != "ns/consumer@node-a" || pod.Annotations[OriginalNameAnnotation] != "consumer" {
		t.Fatalf("annotations %v", pod.Annotations)
	}
	if len(pod.Spec.ImagePullSecrets) != 2 || pod.Spec.ImagePullSecrets[1].Name != "regcred" {
		t.Fatalf("pull secrets %v", pod.Spec.ImagePullSecrets)
	}
	app := pod.Spec.Containers[0]
	if app.Image != "reg/consumer@sha256:1" || app.Command != nil || app.Env != nil || len(app.Ports) != 1 {
		t.Fatalf("restored container carries more than restore needs: %+v", app)
	}
	if len(app.VolumeMounts) != 1 || app.VolumeMounts[0].Name != "data" {
		t.Fatalf("the restored container must keep its volume mounts but the token's: %+v", app.VolumeMounts)
	}
	side := pod.Spec.Containers[1]
	if side.Image != "side:1" || len(side.VolumeMounts) != 1 || side.VolumeMounts[0].Name != "cache" {
		t.Fatalf("a container that is not migrated starts afresh without the token mount: %+v", side)
	}
	if len(pod.Spec.Volumes) != 2 || pod.Spec.Volumes[0].Name != "cache" || pod.Spec.Volumes[1].PersistentVolumeClaim.ClaimName != "data-consumer" {
		t.Fatalf("volumes %v", pod.Spec.Volumes)
	}
	if source.Spec.ImagePullSecrets[0].Name != "pull" || len(source.Spec.ImagePullSecrets) != 1 {
		t.Fatal("the source pod was modified")
	}
	again := targetPod(pod, "consumer-x2", "node-a", "x2", map[string]string{"app": "reg/consumer@sha256:2"}, "regcred")
	if again.Annotations[OriginalNameAnnotation] != "consumer" || len(again.Spec.ImagePullSecrets) != 2 {
		t.Fatal("a second migration keeps the original name and does not repeat the secret")
	}
	// A restore needs the image the container was first created from, not
	// the checkpoint the pod runs now.
	if bases := BaseImages(again); bases["app"] != "app:1" || bases["sidecar"] != "side:1" {
		t.Fatalf("base images after two migrations: %v", bases)
	}
}

// TestBaseImagesPinTheRunningDigest: restore builds on the very image the
// source runs, so a tag that moved since must not be pulled.
func TestBaseImagesPinTheRunningDigest(t *testing.T) {
	t.Parallel()
	d := strings.Repeat("ab", 32)
	for _, tc := range []struct{ image, imageID, want string }{
		{"reg:5000/app:lab", "reg:5000/app@sha256:" + d, "reg:5000/app@sha256:" + d},
		{"reg:5000/app:lab", "sha256:" + d, "reg:5000/app@sha256:" + d},
		{"reg:5000/app", "docker.io/library/app@sha256:" + d, "reg:5000/app@sha256:" + d},
		{"reg:5000/app@sha256:" + d, "", "reg:5000/app@sha256:" + d},
		{"app:1", "", "app:1"},
		{"app:1", "sha256:short", "app:1"},
	} {
		pod := &corev1.Pod{
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: tc.image}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "c", ImageID: tc.imageID}}},
		}
		if got := BaseImages(pod)["c"]; got != tc.want {
			t.Errorf("%s running %q: base %s, want %s", tc.image, tc.imageID, got, tc.want)
		}
	}
}

// TestTargetPodKeepsSidecars: a native sidecar goes with the pod on every
// path, starting afresh after the emptyDir volumes are filled and before
// the address wait ends; the other init containers ran on the source.
func TestTargetPodKeepsSidecars(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	source := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "ns"},
		Spec: corev1.PodSpec{
			NodeName: "node-a",
			InitContainers: []corev1.Container{
				{Name: "migrate-schema", Image: "tools:1"},
				{Name: "log-shipper", Image: "shipper:1", RestartPolicy: &always, VolumeMounts: []corev1.VolumeMount{
					{Name: "logs", MountPath: "/logs"}, {Name: "kube-api-access-abcde", MountPath: "/var/run/secrets"}}},
			},
			Containers: []corev1.Container{{Name: "app", Image: "app:1", VolumeMounts: []corev1.VolumeMount{{Name: "logs", MountPath: "/var/log/app"}}}},
			Volumes:    []corev1.Volume{{Name: "logs", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}, {Name: "kube-api-access-abcde"}},
		},
	}
	names := func(cs []corev1.Container) string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Name)
		}
		return strings.Join(n, ",")
	}
	images := map[string]string{"app": "reg/consumer@sha256:1", agent.VolumesKey: "reg/volumes@sha256:1"}
	cri := RestoredPod(source, "consumer-x1", "node-b", "x1", images, "", RestoreCRI)
	if got := names(cri.Spec.InitContainers); got != volumeInitContainer+",log-shipper" {
		t.Fatalf("init containers through the CRI: %s", got)
	}
	shipper := cri.Spec.InitContainers[1]
	if shipper.Image != "shipper:1" || *shipper.RestartPolicy != always || len(shipper.VolumeMounts) != 1 || shipper.VolumeMounts[0].Name != "logs" {
		t.Fatalf("the sidecar must start afresh from its spec, without the token mount: %+v", shipper)
	}
	c := Config{Restore: RestoreRuntime, TargetName: "consumer-x1", TargetNode: "node-b", ID: "x1", AgentImage: "agent:1"}
	if got := names(PlannedTarget(c, source, images).Spec.InitContainers); got != "log-shipper,"+AddressInitContainer {
		t.Fatalf("init containers through the kubectl-migrate runtime: %s", got)
	}
	if len(cri.Spec.Volumes) != 1 || cri.Spec.Volumes[0].Name != "logs" {
		t.Fatalf("volumes %v", cri.Spec.Volumes)
	}
}
