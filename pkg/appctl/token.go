package appctl

import (
	"context"
	"crypto/rand"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

// EnsureToken creates namespace's Secret ms2m.ControlSecret with a random
// token unless it exists, and returns the token and whether it created
// it. An existing token is kept: the running applications took it at start.
func EnsureToken(ctx context.Context, client kubernetes.Interface, namespace string) (token string, created bool, err error) {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: ms2m.ControlSecret, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/managed-by": "kubectl-migrate"}},
		Data:       map[string][]byte{ms2m.TokenKey: []byte(rand.Text())},
	}
	_, err = client.CoreV1().Secrets(namespace).Create(ctx, secret, metav1.CreateOptions{})
	if err == nil {
		return string(secret.Data[ms2m.TokenKey]), true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return "", false, fmt.Errorf("create Secret %s in namespace %s: %w", ms2m.ControlSecret, namespace, err)
	}
	existing, err := client.CoreV1().Secrets(namespace).Get(ctx, ms2m.ControlSecret, metav1.GetOptions{})
	if err != nil {
		return "", false, fmt.Errorf("read Secret %s in namespace %s: %w", ms2m.ControlSecret, namespace, err)
	}
	return string(existing.Data[ms2m.TokenKey]), false, nil
}
