package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// checkpointPath checkpoints a container through the node's runtime.
const checkpointPath = "/checkpoint"

// Labels the kubelet puts on every container it creates.
const (
	podNamespaceLabel  = "io.kubernetes.pod.namespace"
	podNameLabel       = "io.kubernetes.pod.name"
	containerNameLabel = "io.kubernetes.container.name"
)

// CheckpointRequest names the container to checkpoint. UID, if set, must
// be its pod's: a pod deleted and created again under its name is another.
type CheckpointRequest struct {
	Namespace      string `json:"namespace"`
	Pod            string `json:"pod"`
	UID            string `json:"uid,omitempty"`
	Container      string `json:"container"`
	TimeoutSeconds int64  `json:"timeoutSeconds,omitempty"`
	// LazyPages asks that the pages stay in the frozen source until the
	// restored copy has them (ociruntime's lazy pages): only a container
	// under the kubectl-migrate runtime can, and it needs UID.
	LazyPages bool `json:"lazyPages,omitempty"`
}

// CheckpointResult is where the archive is on the node.
type CheckpointResult struct {
	Archive string `json:"archive"`
	Tries   int    `json:"tries"`
	// LazyPages: the pages wait in the source (CheckpointRequest.LazyPages
	// was asked and the container's runtime did it).
	LazyPages bool `json:"lazyPages,omitempty"`
}

// DefaultCheckpointRetry: five tries of a checkpoint in all, within about
// eight seconds.
var DefaultCheckpointRetry = wait.Backoff{Steps: 5, Duration: 250 * time.Millisecond, Factor: 2, Jitter: 1}

// checkpointContainer does what the kubelet's checkpoint API does, over
// the runtime's socket: the agent already holds it, so whoever migrates
// needs no access to the kubelet's API (nodes/proxy reaches all of it, on
// every node). The archive is named as the kubelet names it
// (ArchivePattern).
func checkpointContainer(ctx context.Context, socket, stage string, req CheckpointRequest, backoff wait.Backoff) (CheckpointResult, error) {
	if req.Namespace == "" || req.Pod == "" || req.Container == "" {
		return CheckpointResult{}, statusError{http.StatusBadRequest, "checkpoint: namespace, pod and container are required"}
	}
	if req.LazyPages && (stage == "" || req.UID == "") {
		return CheckpointResult{}, statusError{http.StatusBadRequest, "a lazy checkpoint needs the pod's UID and an agent with the node's stage"}
	}
	lazy := ociruntime.Identity{Namespace: req.Namespace, Pod: req.Pod, UID: req.UID, Container: req.Container}
	conn, err := dialRuntime(socket)
	if err != nil {
		return CheckpointResult{}, err
	}
	defer conn.Close()
	client := criv1.NewRuntimeServiceClient(conn)
	selector := map[string]string{podNamespaceLabel: req.Namespace, podNameLabel: req.Pod, containerNameLabel: req.Container}
	if req.UID != "" {
		selector[podUIDLabel] = req.UID
	}
	list, err := client.ListContainers(ctx, &criv1.ListContainersRequest{Filter: &criv1.ContainerFilter{
		State:         &criv1.ContainerStateValue{State: criv1.ContainerState_CONTAINER_RUNNING},
		LabelSelector: selector,
	}})
	if err != nil {
		return CheckpointResult{}, fmt.Errorf("ask the runtime for container %s of %s/%s: %w", req.Container, req.Namespace, req.Pod, err)
	}
	if len(list.GetContainers()) != 1 {
		return CheckpointResult{}, statusError{http.StatusNotFound, fmt.Sprintf("no running container %s of pod %s/%s on this node (the runtime lists %d)", req.Container, req.Namespace, req.Pod, len(list.GetContainers()))}
	}
	id := list.GetContainers()[0].GetId()
	res := CheckpointResult{Archive: filepath.Join(archiveDir, fmt.Sprintf("checkpoint-%s_%s-%s-%s.tar", req.Pod, req.Namespace, req.Container, time.Now().UTC().Format(time.RFC3339)))}
	// A runtime failure can pass: CRIU refuses to dump a listening socket
	// with a connection not yet accepted, and an HTTP probe (or a metrics
	// scrape) that arrives in the fraction of a second the container is
	// frozen leaves exactly that ("In-flight connection" in CRIU's log,
	// "criu failed: type NOTIFY errno 0" in the runtime's answer). The lab
	// hit it in about one checkpoint in twenty with probes every 2 and 5 s.
	// The container keeps running after a failed dump, so trying again is
	// safe; the jitter keeps the tries out of step with periodic probes.
	if backoff.Steps == 0 {
		backoff = DefaultCheckpointRetry
	}
	err = retry.OnError(backoff, runtimeFailed, func() error {
		res.Tries++
		if req.LazyPages {
			// Each try asks again: a try the runtime took consumed it.
			if err := askLazy(stage, lazy); err != nil {
				return err
			}
		}
		_, err := client.CheckpointContainer(ctx, &criv1.CheckpointContainerRequest{ContainerId: id, Location: res.Archive, Timeout: req.TimeoutSeconds})
		return err
	})
	if req.LazyPages {
		res.LazyPages = tookLazy(stage, lazy)
	}
	if err != nil {
		return res, statusError{http.StatusInternalServerError, fmt.Sprintf("the runtime failed %d time(s): %s", res.Tries, status.Convert(err).Message())}
	}
	return res, nil
}

// askLazy leaves the request the kubectl-migrate runtime reads at the
// container's next checkpoint.
func askLazy(stage string, id ociruntime.Identity) error {
	path := ociruntime.LazyRequestPath(stage, id)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, nil, 0o600)
}

// tookLazy says whether the runtime checkpointed lazily: it took the
// request and serves the pages. A request left behind means another
// runtime checkpointed the container whole; it goes.
func tookLazy(stage string, id ociruntime.Identity) bool {
	request := ociruntime.LazyRequestPath(stage, id)
	left := os.Remove(request) == nil
	// The directories askLazy made go once empty: nothing is staged on
	// this node for the pod.
	for dir := filepath.Dir(request); dir != filepath.Clean(stage) && strings.HasPrefix(dir, stage); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break
		}
	}
	if left {
		return false
	}
	_, err := os.Stat(ociruntime.PagesSocket(stage, id))
	return err == nil
}

// runtimeFailed tells a failed dump (worth another try) from a refusal.
func runtimeFailed(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.Unimplemented, codes.InvalidArgument, codes.PermissionDenied, codes.Canceled, codes.DeadlineExceeded:
		return false
	}
	return true
}

// Checkpoint checkpoints one container of the pod with uid on node,
// through node's warm agent (started with a RuntimeSocket), and returns the
// archive's path there. The container keeps running.
func (l Launcher) Checkpoint(ctx context.Context, node string, req CheckpointRequest) (CheckpointResult, error) {
	warm, ok := l.Serving.pod(node)
	if !ok || !warm.runtime {
		return CheckpointResult{}, fmt.Errorf("checkpoint %s/%s on node %s: no agent there reaches the node's runtime", req.Pod, req.Container, node)
	}
	out, err := l.call(ctx, warm, http.MethodPost, checkpointPath, req)
	if err != nil {
		return CheckpointResult{}, explainCheckpoint(node, req, err)
	}
	return decodeAnswer[CheckpointResult](node, out)
}

// CheckpointError is a checkpoint the runtime refused: what happened, and
// what to change.
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

// explainCheckpoint names the remedy for a checkpoint the agent answered
// with a failure, from the runtime's words.
func explainCheckpoint(node string, req CheckpointRequest, err error) error {
	what := fmt.Sprintf("checkpoint %s/%s on node %s", req.Pod, req.Container, node)
	detail := err.Error()
	explained := func(remedy string) error {
		return &CheckpointError{Finding: what + ": " + kube.ShortAnswer(detail), Remedy: remedy, err: err}
	}
	switch {
	case strings.Contains(detail, "no running container"):
		return fmt.Errorf("%s: %w", what, err)
	case strings.Contains(detail, "TCP socket") || strings.Contains(detail, "tcp-established"):
		return explained("put tcp-close (or tcp-established) in /etc/criu/runc.conf on every node")
	case strings.Contains(detail, "criu failed"):
		return explained("CRIU's log on the node says why: if it is \"In-flight connection\", connections (probes) kept arriving while the container was frozen, and skip-in-flight in /etc/criu/runc.conf on the nodes avoids it")
	case strings.Contains(detail, "the runtime failed"):
		return explained("check that the runtime supports checkpointing (CRI-O: enable_criu_support) and CRIU is installed on the node")
	}
	return fmt.Errorf("%s: %w", what, err)
}
