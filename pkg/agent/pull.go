package agent

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// RuntimeSockets are the CRI sockets of the runtimes that restore, by the
// name the kubelet reports (nodeInfo.containerRuntimeVersion's scheme).
var RuntimeSockets = map[string]string{
	"cri-o":      "/var/run/crio/crio.sock",
	"containerd": "/run/containerd/containerd.sock",
}

// dialRuntime connects to the runtime's CRI socket (connections are made
// lazily, at the first call).
func dialRuntime(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// runtimeSocketPath is where a serving agent finds its node's runtime.
const runtimeSocketPath = "/var/run/kubectl-migrate/cri.sock"

// pullRequest names the images a node must have.
type pullRequest struct {
	Images []string `json:"images"`
}

// PullResult says what a pull through the runtime did.
type PullResult struct {
	// Present were on the node already; Pulled were pulled now.
	Present []string `json:"present,omitempty"`
	Pulled  []string `json:"pulled,omitempty"`
}

// pullImages makes the node's runtime have images, asking it over CRI
// directly (no pod to start): what it has is found at once, the rest is
// pulled with the runtime's own credentials (a registry that needs the
// pod's pull secret fails here, and the caller pulls through a pod).
//
// auth, if set, is presented for images of the agent's own registry
// (DirectRegistry), which serves only with credentials.
func pullImages(ctx context.Context, socket string, images []string, auth *criv1.AuthConfig) (PullResult, error) {
	conn, err := dialRuntime(socket)
	if err != nil {
		return PullResult{}, err
	}
	defer conn.Close()
	client := criv1.NewImageServiceClient(conn)
	var res PullResult
	for _, img := range images {
		spec := &criv1.ImageSpec{Image: img}
		status, err := client.ImageStatus(ctx, &criv1.ImageStatusRequest{Image: spec})
		if err != nil {
			return res, fmt.Errorf("ask the runtime for %s: %w", img, err)
		}
		if status.GetImage() != nil {
			res.Present = append(res.Present, img)
			continue
		}
		req := &criv1.PullImageRequest{Image: spec}
		if strings.HasPrefix(img, DirectRegistry()+"/") {
			req.Auth = auth
		}
		if _, err := client.PullImage(ctx, req); err != nil {
			return res, fmt.Errorf("pull %s: %w", img, err)
		}
		res.Pulled = append(res.Pulled, img)
	}
	return res, nil
}

// RuntimeInfo is what a node's runtime says of itself over CRI.
type RuntimeInfo struct {
	Name    string `json:"name"`    // e.g. "containerd"
	Version string `json:"version"` // e.g. "v2.3.7"
	// Config is the runtime's configuration as its verbose status reports
	// it (JSON; runtimesupport.Support.WithConfig reads it), or "".
	Config string `json:"config,omitempty"`
}

// runtimeInfo asks the runtime at socket for its version and configuration.
func runtimeInfo(ctx context.Context, socket string) (RuntimeInfo, error) {
	conn, err := dialRuntime(socket)
	if err != nil {
		return RuntimeInfo{}, err
	}
	defer conn.Close()
	client := criv1.NewRuntimeServiceClient(conn)
	v, err := client.Version(ctx, &criv1.VersionRequest{})
	if err != nil {
		return RuntimeInfo{}, fmt.Errorf("ask the runtime its version: %w", err)
	}
	st, err := client.Status(ctx, &criv1.StatusRequest{Verbose: true})
	if err != nil {
		return RuntimeInfo{}, fmt.Errorf("ask the runtime its status: %w", err)
	}
	return RuntimeInfo{Name: v.GetRuntimeName(), Version: v.GetRuntimeVersion(), Config: st.GetInfo()["config"]}, nil
}

// RuntimeSocket is the CRI socket of the runtime a node reports in its
// nodeInfo.containerRuntimeVersion ("cri-o://1.34.0"), or "" if unknown.
func RuntimeSocket(version string) string {
	name, _, _ := strings.Cut(version, "://")
	return RuntimeSockets[name]
}
