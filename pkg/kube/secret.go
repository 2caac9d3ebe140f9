package kube

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// EnsureSecret creates secret unless a Secret of its name exists, and
// returns the one stored and whether it created it: a key or token made
// once is kept by whoever comes second.
func EnsureSecret(ctx context.Context, client kubernetes.Interface, secret *corev1.Secret) (*corev1.Secret, bool, error) {
	secrets := client.CoreV1().Secrets(secret.Namespace)
	created, err := secrets.Create(ctx, secret, metav1.CreateOptions{})
	if err == nil {
		return created, true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, false, err
	}
	existing, err := secrets.Get(ctx, secret.Name, metav1.GetOptions{})
	return existing, false, err
}

// DeleteSecret deletes the Secret name of namespace; one already gone is
// no error.
func DeleteSecret(ctx context.Context, client kubernetes.Interface, namespace, name string) error {
	err := client.CoreV1().Secrets(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
