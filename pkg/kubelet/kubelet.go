// Package kubelet asks the API server whether it reaches a node's kubelet
// (GET /api/v1/nodes/{node}/proxy/healthz), so the plugin needs no network
// path to the nodes. It is all a migration asks of kubelets: the checkpoint
// itself goes through the node's agent and runtime (pkg/agent), so whoever
// migrates needs no create on nodes/proxy, which reaches a kubelet's whole
// API.
package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// Client talks to kubelets through the API server.
type Client struct {
	// REST is the core/v1 REST client, e.g. clientset.CoreV1().RESTClient().
	REST rest.Interface
}

// Healthy returns nil if node's kubelet answers its health check through
// the API server. Its error is an apierrors.APIStatus with a gateway code
// (503) when the API server answered but could not reach the kubelet, or
// the kubelet answered unhealthy; anything else when the API server itself
// did not answer or refused.
func (c Client) Healthy(ctx context.Context, node string) error {
	body, err := c.REST.Get().Resource("nodes").Name(node).SubResource("proxy", "healthz").DoRaw(ctx)
	if err != nil {
		// The API server's own text ("error trying to reach service: dial
		// tcp …: connection refused") says more than client-go's for a 503.
		detail := strings.TrimSpace(string(body))
		var status metav1.Status
		if json.Unmarshal(body, &status) == nil && status.Message != "" {
			detail = status.Message
		}
		if detail != "" {
			return &kubeletError{fmt.Sprintf("the kubelet on %s does not answer: %s", node, kube.ShortAnswer(detail)), err}
		}
		return fmt.Errorf("the kubelet on %s does not answer: %w", node, err)
	}
	if answer := strings.TrimSpace(string(body)); answer != "ok" {
		return apierrors.NewServiceUnavailable(fmt.Sprintf("the kubelet on %s is not healthy: %s", node, kube.ShortAnswer(answer)))
	}
	return nil
}

// kubeletError is an error with its own text around the API server's.
type kubeletError struct {
	msg string
	err error
}

func (e *kubeletError) Error() string { return e.msg }
func (e *kubeletError) Unwrap() error { return e.err }
