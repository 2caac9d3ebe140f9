// Package kubelet calls the kubelet's Forensic Container Checkpointing API
// through the API server's node proxy, so the plugin needs no network path to
// the nodes: POST /api/v1/nodes/{node}/proxy/checkpoint/{ns}/{pod}/{container}.
package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

// Client talks to kubelets through the API server.
type Client struct {
	// REST is the core/v1 REST client, e.g. clientset.CoreV1().RESTClient().
	REST rest.Interface
	// Retry spaces the tries of a checkpoint the runtime failed; zero
	// means DefaultCheckpointRetry.
	Retry wait.Backoff
}

// CheckpointResult is the kubelet's answer to a checkpoint request.
type CheckpointResult struct {
	Items []string `json:"items"`
}

// DefaultCheckpointRetry: five tries of a checkpoint in all, within about
// eight seconds.
var DefaultCheckpointRetry = wait.Backoff{Steps: 5, Duration: 250 * time.Millisecond, Factor: 2, Jitter: 1}

// Checkpoint checkpoints one container and returns the archive's path on the
// node. The running container keeps running.
func (c Client) Checkpoint(ctx context.Context, node, namespace, pod, container string, timeout time.Duration) (string, error) {
	request := func() *rest.Request {
		req := c.REST.Post().Resource("nodes").Name(node).
			SubResource("proxy", "checkpoint", namespace, pod, container)
		if timeout > 0 {
			// The kubelet accepts whole seconds only; anything else is a 404.
			req = req.Param("timeout", strconv.Itoa(int(max(1, timeout.Round(time.Second)/time.Second))))
		}
		return req
	}
	// A runtime failure can pass: CRIU refuses to dump a listening socket
	// with a connection not yet accepted, and an HTTP probe (or a metrics
	// scrape) that arrives in the fraction of a second the container is
	// frozen leaves exactly that ("In-flight connection" in CRIU's log,
	// "criu failed: type NOTIFY errno 0" in the runtime's answer). The lab
	// hit it in about one checkpoint in twenty with probes every 2 and 5 s.
	// The container keeps running after a failed dump, so trying again is
	// safe; the jitter keeps the tries out of step with periodic probes.
	backoff := c.Retry
	if backoff.Steps == 0 {
		backoff = DefaultCheckpointRetry
	}
	var body []byte
	err := retry.OnError(backoff, isRuntimeFailure, func() error {
		var err error
		body, err = request().DoRaw(ctx)
		return err
	})
	if err != nil {
		return "", checkpointError(node, pod, container, err, body, backoff.Steps)
	}
	var res CheckpointResult
	if err := json.Unmarshal(body, &res); err != nil || len(res.Items) == 0 {
		return "", fmt.Errorf("checkpoint %s/%s on node %s: unexpected kubelet answer %q", pod, container, node, truncate(string(body)))
	}
	return res.Items[0], nil
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
			return &kubeletError{fmt.Sprintf("the kubelet on %s does not answer: %s", node, truncate(detail)), err}
		}
		return fmt.Errorf("the kubelet on %s does not answer: %w", node, err)
	}
	if answer := strings.TrimSpace(string(body)); answer != "ok" {
		return apierrors.NewServiceUnavailable(fmt.Sprintf("the kubelet on %s is not healthy: %s", node, truncate(answer)))
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

func isRuntimeFailure(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) && status.Status().Code == http.StatusInternalServerError
}

// CheckpointError is a checkpoint the kubelet or the runtime refused: what
// happened, and what to change.
type CheckpointError struct {
	Finding, Remedy string
	err             error
}

func (e *CheckpointError) Error() string { return e.Finding + "; " + e.Remedy }
func (e *CheckpointError) Unwrap() error { return e.err }

// usualCauses is what to look at when a checkpoint failed for a reason
// nobody named.
const usualCauses = "CRIU's log on the source node (the error names it) has the cause; the usual ones: CRIU missing or older than 4.2, an established TCP connection without tcp-close in /etc/criu/runc.conf, a connection arriving mid-dump without skip-in-flight there, a Multipath TCP socket (Go ≥ 1.24 listens with MPTCP unless told not to)"

// CheckpointRemedy is what to change after the failed checkpoint err: what
// its CheckpointError names, or the usual causes.
func CheckpointRemedy(err error) string {
	var ce *CheckpointError
	if errors.As(err, &ce) {
		return ce.Remedy
	}
	return usualCauses
}

func checkpointError(node, pod, container string, err error, body []byte, tries int) error {
	what := fmt.Sprintf("checkpoint %s/%s on node %s", pod, container, node)
	var status apierrors.APIStatus
	code := 0
	if errors.As(err, &status) {
		code = int(status.Status().Code)
	}
	detail := strings.TrimSpace(string(body))
	if detail == "" {
		detail = err.Error()
	}
	explained := func(remedy, format string, args ...any) error {
		return &CheckpointError{Finding: what + ": " + fmt.Sprintf(format, args...), Remedy: remedy, err: err}
	}
	switch code {
	case http.StatusNotFound:
		return explained("enable the kubelet feature gate ContainerCheckpoint (on by default since 1.30)", "the kubelet has no checkpoint endpoint or no such container (%s)", truncate(detail))
	case http.StatusForbidden:
		return explained("the caller needs create on nodes/proxy (a ClusterRole)", "forbidden (%s)", truncate(detail))
	case http.StatusInternalServerError:
		switch {
		case strings.Contains(detail, "TCP socket") || strings.Contains(detail, "tcp-established"):
			return explained("put tcp-close (or tcp-established) in /etc/criu/runc.conf on every node", "CRIU refused an established TCP connection (%s)", truncate(detail))
		case strings.Contains(detail, "criu failed"):
			return explained("CRIU's log on the node says why: if it is \"In-flight connection\", connections (probes) kept arriving while the container was frozen, and skip-in-flight in /etc/criu/runc.conf on the nodes avoids it", "CRIU failed %d times (%s)", tries, truncate(detail))
		}
		return explained("check that the runtime supports checkpointing and CRIU is installed on the node", "the container runtime failed (%s)", truncate(detail))
	}
	return fmt.Errorf("%s: %w", what, err)
}

// truncate shortens a runtime's error text, keeping its end, where CRI-O
// puts the cause.
func truncate(s string) string {
	const head, tail = 120, 400
	if len(s) > head+tail {
		return s[:head] + " … " + s[len(s)-tail:]
	}
	return s
}
