package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Reach asks the API server for namespace, within timeout: any answer it
// gives, a refusal or a 404 included, says it is there; no answer (a
// refused connection, an unknown host, a server that never answers) is
// an error naming how to look into it.
func Reach(ctx context.Context, client kubernetes.Interface, namespace string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	var status apierrors.APIStatus
	if err == nil || errors.As(err, &status) {
		return nil
	}
	return fmt.Errorf("cannot reach the cluster's API server: %w; check the kubeconfig's server and context (kubectl cluster-info)", err)
}
