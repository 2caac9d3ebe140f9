package appctl

import (
	"context"
	"crypto/rand"
	"fmt"
	"path"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// EnsureToken creates namespace's Secret protocol.ControlSecret with a random
// token unless it exists, and returns the token and whether it created
// it. An existing token is kept: the running applications took it at start.
func EnsureToken(ctx context.Context, client kubernetes.Interface, namespace string) (token string, created bool, err error) {
	secret, created, err := kube.EnsureSecret(ctx, client, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: protocol.ControlSecret, Namespace: namespace, Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}},
		Data:       map[string][]byte{protocol.TokenKey: []byte(rand.Text())},
	})
	if err != nil {
		return "", false, fmt.Errorf("the control token (Secret %s in namespace %s): %w", protocol.ControlSecret, namespace, err)
	}
	return string(secret.Data[protocol.TokenKey]), created, nil
}

// MountToken mounts the namespace's control token into each of spec's
// containers where the SDK reads it (protocol.DefaultTokenFile).
func MountToken(spec *corev1.PodSpec) {
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "ms2m-control", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: protocol.ControlSecret}}})
	for i := range spec.Containers {
		c := &spec.Containers[i]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "ms2m-control", MountPath: path.Dir(protocol.DefaultTokenFile), ReadOnly: true})
	}
}
