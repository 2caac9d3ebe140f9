package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
)

// labImages are static binaries of this repository, each pushed as a
// one-layer image to the lab registry.
var labImages = map[string]string{
	"pause":                 "./test/lab/pause",
	"kubectl-migrate-agent": "./cmd/kubectl-migrate-agent",
	"ms2m-producer":         "./cmd/ms2m-producer",
	"ms2m-consumer":         "./cmd/ms2m-consumer",
	"inventory":             "./examples/inventory",
}

// ImageRef is where the lab serves a binary's image.
func imageRef(name string) string {
	if name == "pause" {
		return registry + "/kubectl-migrate/pause:lab"
	}
	return registry + "/kubectl-migrate/" + name + ":lab"
}

// pushImages builds the binaries from the checkout at repo and pushes their
// images; rebuilding is cheap with Go's build cache.
func (d dirs) pushImages(ctx context.Context, repo string) error {
	out := filepath.Join(d.cache, "images")
	reg := image.Registry{Insecure: true}
	for name, pkg := range labImages {
		bin := filepath.Join(out, name)
		build := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
		build.Dir = repo
		build.Env = append(build.Environ(), "CGO_ENABLED=0")
		if b, err := build.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v: %s", name, err, b)
		}
		img, err := image.BinaryImage(bin, runtime.GOARCH)
		if err != nil {
			return err
		}
		if _, err := reg.Push(ctx, imageRef(name), img); err != nil {
			return err
		}
	}
	return nil
}

// evictImages removes the lab's images (but the pause image, which every
// sandbox uses) from the running nodes' runtimes: pods pull with
// IfNotPresent, so a node would otherwise keep running what it pulled
// first. An image a running container uses stays, and is named.
func (d dirs) evictImages(ctx context.Context) error {
	rt, err := d.runtime()
	if err != nil {
		return err
	}
	for _, n := range nodes {
		pid, ok := d.running(rt.daemon(n))
		if !ok {
			continue
		}
		conn, err := grpc.NewClient(fmt.Sprintf("unix:///proc/%d/root%s", pid, rt.socket), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		images := criv1.NewImageServiceClient(conn)
		for name := range labImages {
			if name == "pause" {
				continue
			}
			_, err := images.RemoveImage(ctx, &criv1.RemoveImageRequest{Image: &criv1.ImageSpec{Image: imageRef(name)}})
			if err != nil && status.Code(err) != codes.NotFound {
				fmt.Fprintf(os.Stderr, "lab: %s keeps its %s (in use?): %v\n", n.Name, name, err)
			}
		}
		conn.Close()
	}
	return nil
}
