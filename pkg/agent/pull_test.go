package agent

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeImages is a runtime's image service holding some images.
type fakeImages struct {
	criv1.UnimplementedImageServiceServer
	mu   sync.Mutex
	have map[string]bool
	// auth is the credential each pull presented.
	auth map[string]*criv1.AuthConfig
}

func (f *fakeImages) ImageStatus(_ context.Context, req *criv1.ImageStatusRequest) (*criv1.ImageStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.have[req.Image.Image] {
		return &criv1.ImageStatusResponse{}, nil
	}
	return &criv1.ImageStatusResponse{Image: &criv1.Image{Id: req.Image.Image}}, nil
}

func (f *fakeImages) PullImage(_ context.Context, req *criv1.PullImageRequest) (*criv1.PullImageResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.have[req.Image.Image] = true
	if f.auth == nil {
		f.auth = map[string]*criv1.AuthConfig{}
	}
	f.auth[req.Image.Image] = req.Auth
	return &criv1.PullImageResponse{ImageRef: req.Image.Image}, nil
}

// TestPullImagesThroughTheRuntime: what the node has is only looked up, the
// rest is pulled, and the node has all of it afterwards; the agent's read
// credential goes only to its own registry.
func TestPullImagesThroughTheRuntime(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	images := &fakeImages{have: map[string]bool{"reg/app@sha256:1": true}}
	srv := grpc.NewServer()
	criv1.RegisterImageServiceServer(srv, images)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	own := DirectRegistry() + "/" + ProbeImage
	auth := &criv1.AuthConfig{Username: PullUser, Password: PullPassword("push")}
	res, err := pullImages(context.Background(), socket, []string{"reg/app@sha256:1", "reg/side@sha256:2", own}, auth)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Present, []string{"reg/app@sha256:1"}) || !slices.Equal(res.Pulled, []string{"reg/side@sha256:2", own}) || !images.have["reg/side@sha256:2"] {
		t.Fatalf("result %+v, node has %v", res, images.have)
	}
	if got := images.auth[own]; images.auth["reg/side@sha256:2"] != nil || got.GetUsername() != auth.Username || got.GetPassword() != auth.Password {
		t.Fatalf("credentials presented: %v", images.auth)
	}
	if RuntimeSocket("cri-o://1.34.0") != "/var/run/crio/crio.sock" || RuntimeSocket("docker://28") != "" {
		t.Fatal("runtime sockets")
	}
}

// fakeRuntime answers Version and a verbose Status the way containerd does.
type fakeRuntime struct {
	criv1.UnimplementedRuntimeServiceServer
	config string
}

func (f fakeRuntime) Version(context.Context, *criv1.VersionRequest) (*criv1.VersionResponse, error) {
	return &criv1.VersionResponse{RuntimeName: "containerd", RuntimeVersion: "v2.3.7"}, nil
}

func (f fakeRuntime) Status(_ context.Context, req *criv1.StatusRequest) (*criv1.StatusResponse, error) {
	res := &criv1.StatusResponse{Status: &criv1.RuntimeStatus{}}
	if req.Verbose {
		res.Info = map[string]string{"config": f.config}
	}
	return res, nil
}

// TestRuntimeInfoReadsTheVerboseStatus: the configuration is only in the
// verbose answer; the agent must ask for it.
func TestRuntimeInfoReadsTheVerboseStatus(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	criv1.RegisterRuntimeServiceServer(srv, fakeRuntime{config: `{"enableExperimentalRestoreViaCreate":false}`})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	info, err := runtimeInfo(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "containerd" || info.Version != "v2.3.7" || info.Config != `{"enableExperimentalRestoreViaCreate":false}` {
		t.Fatalf("%+v", info)
	}
}
