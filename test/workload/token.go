package workload

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// CreateControlToken creates namespace's control token (protocol.ControlSecret),
// as kubectl migrate control-token does, and returns it.
func CreateControlToken(ctx context.Context, client kubernetes.Interface, namespace string) (string, error) {
	token, _, err := appctl.EnsureToken(ctx, client, namespace)
	return token, err
}

// MountControlToken mounts the namespace's control token into each of
// spec's containers where the SDK reads it (protocol.DefaultTokenFile).
func MountControlToken(spec *corev1.PodSpec) { appctl.MountToken(spec) }

// token is the token calls to the workload's applications carry: Token if
// set, else its namespace's (read once it exists).
func (w *Workload) token(ctx context.Context) string {
	if w.Token != "" {
		return w.Token
	}
	s, err := w.client.CoreV1().Secrets(w.Namespace).Get(ctx, protocol.ControlSecret, metav1.GetOptions{})
	if err == nil {
		w.Token = string(s.Data[protocol.TokenKey])
	} else if !apierrors.IsNotFound(err) {
		return ""
	}
	return w.Token
}
