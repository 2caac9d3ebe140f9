package migrate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// defaultKubeletTimeout is how long a node's kubelet may not answer before
// a migration stops waiting for it: long enough for a kubelet restart.
const defaultKubeletTimeout = 15 * time.Second

func (m *Migration) kubeletTimeout() time.Duration {
	if m.config.KubeletTimeout > 0 {
		return m.config.KubeletTimeout
	}
	return defaultKubeletTimeout
}

// kubeletAway watches node's kubelet until ctx ends and reports, once, that
// it has not answered for the kubelet timeout: a pod there would then never
// start, nor its deletion be confirmed. Only answers of the API server that
// it cannot reach the kubelet count; an API server that does not answer
// itself is an outage the rest of the migration rides out with retries.
func (m *Migration) kubeletAway(ctx context.Context, node string) <-chan error {
	away := make(chan error, 1)
	timeout := m.kubeletTimeout()
	go func() {
		var since time.Time
		_ = wait.PollUntilContextCancel(ctx, min(time.Second, timeout/4), true, func(ctx context.Context) (bool, error) {
			err := m.deps.Kubelet.Healthy(ctx, node)
			switch {
			case err == nil:
				since = time.Time{}
			case ctx.Err() != nil || !kubeletUnreachable(err):
			case since.IsZero():
				since = time.Now()
			case time.Since(since) >= timeout:
				away <- fmt.Errorf("%w (for %s)", err, time.Since(since).Round(time.Second))
				return true, nil
			}
			return false, nil
		})
	}()
	return away
}

// kubeletUnreachable tells an API server that answered that it cannot reach
// the kubelet (a gateway error) from every other failure: a refusal
// (forbidden) or an API server that does not answer says nothing of the
// kubelet.
func kubeletUnreachable(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	switch status.Status().Code {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// deletePod deletes pod name and waits until it is gone. The delete is
// graceful: the pod is gone only once its processes are, and a restored
// copy still running when the migration ends would take its primary queue
// back. If the pod's kubelet stops answering meanwhile, it would never
// confirm; then the node's agent stops the pod's sandboxes through the
// runtime, which proves the processes gone, and the pod is deleted at once.
// deleteGrace is the grace period the migration deletes a source or a copy
// with: the pod's own (nil), or none for a process without the contract,
// which is killed rather than asked to end, since its shutdown handler (a
// store saving itself to a shared volume) would act on what the other copy
// serves.
func (m *Migration) deleteGrace() *int64 {
	if m.config.Strategy.Contract() {
		return nil
	}
	return ptr.To[int64](0)
}

func (m *Migration) deletePod(ctx context.Context, phase report.PhaseName, name string) error {
	pod, err := m.deps.Client.CoreV1().Pods(m.config.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("get pod %s: %w", name, err)
	case pod.Spec.NodeName == "":
		return kube.DeleteAndWait(ctx, m.deps.Client, m.config.Namespace, name, ptr.To[int64](0)) // never ran anywhere
	}
	node := pod.Spec.NodeName
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	away := m.kubeletAway(watchCtx, node)
	gone := make(chan error, 1)
	go func() { gone <- kube.DeleteAndWait(watchCtx, m.deps.Client, m.config.Namespace, name, m.deleteGrace()) }()
	var awayErr error
	select {
	case err := <-gone:
		return err
	case awayErr = <-away:
	}
	stop()
	<-gone
	m.progress(phase, fmt.Sprintf("stopping pod %s through the runtime of %s: %v", name, node, awayErr))
	stopped, err := m.deps.Packer.StopPod(ctx, node, string(pod.UID))
	if err != nil {
		return fmt.Errorf("%w, and pod %s could not be stopped through the node's runtime either: %w; once the kubelet is back, recover the migration", awayErr, name, err)
	}
	if err := kube.DeleteAndWait(ctx, m.deps.Client, m.config.Namespace, name, ptr.To[int64](0)); err != nil {
		return err
	}
	m.progress(phase, fmt.Sprintf("pod %s deleted; the runtime of %s stopped %d sandbox(es) of it", name, node, len(stopped.Sandboxes)))
	return nil
}
