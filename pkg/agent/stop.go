package agent

import (
	"context"
	"fmt"
	"net/http"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stopPodPath stops a pod's sandboxes through the node's runtime.
const stopPodPath = "/stop-pod"

// podUIDLabel is the label the kubelet puts on every sandbox it creates.
const podUIDLabel = "io.kubernetes.pod.uid"

// stopPodRequest names the pod, by UID: a pod deleted and created again
// under the same name is another pod.
type stopPodRequest struct {
	UID string `json:"uid"`
}

// StopPodResult lists the sandboxes stopped and removed.
type StopPodResult struct {
	Sandboxes []string `json:"sandboxes,omitempty"`
}

// stopPod does what the kubelet would do to a deleted pod when the kubelet
// itself is gone: it stops every sandbox of the pod (and with it every
// container) and removes them, then looks again until none is left, since
// a sandbox can still be in the making when the first list is taken.
func stopPod(ctx context.Context, socket, uid string) (StopPodResult, error) {
	conn, err := dialRuntime(socket)
	if err != nil {
		return StopPodResult{}, err
	}
	defer conn.Close()
	client := criv1.NewRuntimeServiceClient(conn)
	var res StopPodResult
	const rounds = 5
	for range rounds {
		list, err := client.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{Filter: &criv1.PodSandboxFilter{LabelSelector: map[string]string{podUIDLabel: uid}}})
		if err != nil {
			return res, fmt.Errorf("ask the runtime for the sandboxes of pod %s: %w", uid, err)
		}
		if len(list.GetItems()) == 0 {
			return res, nil
		}
		for _, sb := range list.GetItems() {
			if _, err := client.StopPodSandbox(ctx, &criv1.StopPodSandboxRequest{PodSandboxId: sb.GetId()}); err != nil {
				return res, fmt.Errorf("stop sandbox %s of pod %s: %w", sb.GetId(), uid, err)
			}
			if _, err := client.RemovePodSandbox(ctx, &criv1.RemovePodSandboxRequest{PodSandboxId: sb.GetId()}); err != nil {
				return res, fmt.Errorf("remove sandbox %s of pod %s: %w", sb.GetId(), uid, err)
			}
			res.Sandboxes = append(res.Sandboxes, sb.GetId())
		}
	}
	return res, fmt.Errorf("pod %s still has sandboxes after %d rounds of stopping them", uid, rounds)
}

// StopPod has node's warm agent stop and remove the sandboxes of the pod
// with uid through the node's runtime: the way to end a pod's containers
// when the node's kubelet does not answer.
func (l Launcher) StopPod(ctx context.Context, node, uid string) (StopPodResult, error) {
	warm, ok := l.Serving.pod(node)
	if !ok || !warm.runtime {
		return StopPodResult{}, fmt.Errorf("no agent on %s reaches its runtime", node)
	}
	out, err := l.call(ctx, warm, http.MethodPost, stopPodPath, stopPodRequest{UID: uid})
	if err != nil {
		return StopPodResult{}, err
	}
	return decodeAnswer[StopPodResult](node, out)
}
