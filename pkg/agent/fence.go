package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A fence cuts a pod off the network in its own network namespace, so that
// nothing it does after its checkpoint reaches anyone: a process that does
// not follow the MS2M contract keeps running after the kubelet's
// checkpoint (CRI-O pauses and resumes it around the dump and refuses to
// checkpoint one already frozen), and a write it acknowledged then would be
// lost with the source. Requests reach it no more, replies and writes leave
// it no more; loopback stays open, as its own containers talk over it. The
// restored copy runs in a network namespace of its own, without the fence.

// fencePath fences a pod, or lifts its fence.
const fencePath = "/fence"

// NetnsDir is where the node's runtimes pin pods' network namespaces
// (CRI-O and containerd alike, under /var/run, a link to /run); a fencing
// agent mounts it.
const NetnsDir = "/run/netns"

// fenceTable is the fence: one nftables table in the pod's network
// namespace whose input and output chains drop all but loopback.
const fenceTable = "kubectl_migrate_fence"

// fenceRequest names the pod by UID (a pod deleted and created again under
// the same name is another pod); Lift takes its fence away.
type fenceRequest struct {
	UID  string `json:"uid"`
	Lift bool   `json:"lift,omitempty"`
}

// FenceResult names the network namespaces fenced (or freed).
type FenceResult struct {
	Netns []string `json:"netns,omitempty"`
}

// fencePod fences (or frees) the network namespace of every sandbox of the
// pod with uid. Both are idempotent: fencing twice leaves one fence, and
// lifting a fence that is not there succeeds.
func fencePod(ctx context.Context, socket, uid string, lift bool) (FenceResult, error) {
	conn, err := dialRuntime(socket)
	if err != nil {
		return FenceResult{}, err
	}
	defer conn.Close()
	client := criv1.NewRuntimeServiceClient(conn)
	list, err := client.ListPodSandbox(ctx, &criv1.ListPodSandboxRequest{Filter: &criv1.PodSandboxFilter{
		LabelSelector: map[string]string{podUIDLabel: uid},
		State:         &criv1.PodSandboxStateValue{State: criv1.PodSandboxState_SANDBOX_READY},
	}})
	if err != nil {
		return FenceResult{}, fmt.Errorf("ask the runtime for the sandboxes of pod %s: %w", uid, err)
	}
	if len(list.GetItems()) == 0 && !lift {
		return FenceResult{}, statusError{http.StatusNotFound, fmt.Sprintf("pod %s has no running sandbox on this node to fence", uid)}
	}
	var res FenceResult
	for _, sb := range list.GetItems() {
		st, err := client.PodSandboxStatus(ctx, &criv1.PodSandboxStatusRequest{PodSandboxId: sb.GetId(), Verbose: true})
		if err != nil {
			return res, fmt.Errorf("ask the runtime for sandbox %s of pod %s: %w", sb.GetId(), uid, err)
		}
		path, err := sandboxNetns(st.GetInfo())
		if err != nil {
			return res, fmt.Errorf("sandbox %s of pod %s: %w", sb.GetId(), uid, err)
		}
		if err := fenceNetns(path, lift); err != nil {
			return res, fmt.Errorf("sandbox %s of pod %s: %w", sb.GetId(), uid, err)
		}
		res.Netns = append(res.Netns, path)
	}
	return res, nil
}

// sandboxNetns finds a sandbox's network namespace in the runtime's
// verbose status: the network namespace of its OCI spec (CRI-O and
// containerd both report it). It must be one the runtime pinned under
// NetnsDir: an agent opens no other path a status names.
func sandboxNetns(info map[string]string) (string, error) {
	var verbose struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string }
			}
		}
	}
	if err := json.Unmarshal([]byte(info["info"]), &verbose); err != nil {
		return "", fmt.Errorf("the runtime's verbose status is not what CRI-O and containerd report: %w", err)
	}
	for _, ns := range verbose.RuntimeSpec.Linux.Namespaces {
		if ns.Type != "network" {
			continue
		}
		if ns.Path == "" {
			return "", errors.New("it runs on the node's network, which no fence may cut")
		}
		path := filepath.Clean(strings.Replace(ns.Path, "/var/run/", "/run/", 1))
		if filepath.Dir(path) != NetnsDir {
			return "", fmt.Errorf("its network namespace %s is not one the runtime pinned under %s", ns.Path, NetnsDir)
		}
		return path, nil
	}
	return "", errors.New("the runtime names no network namespace for it")
}

// Fence has node's warm agent cut the pod with uid off the network (see
// fencePath), or with lift take the fence away.
func (l Launcher) Fence(ctx context.Context, node, uid string, lift bool) (FenceResult, error) {
	warm, ok := l.Serving.pod(node)
	if !ok || !warm.runtime || !warm.fences {
		return FenceResult{}, fmt.Errorf("no agent on %s may fence pods", node)
	}
	out, err := l.call(ctx, warm, http.MethodPost, fencePath, fenceRequest{UID: uid, Lift: lift})
	if err != nil {
		return FenceResult{}, err
	}
	return decodeAnswer[FenceResult](node, out)
}
