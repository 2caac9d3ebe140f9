package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

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

// pythonImages are Python programs of this repository, each pushed as an
// image of Debian's python3 and pika (the python artifact) plus the script.
var pythonImages = map[string]string{
	"python-consumer": "examples/python/ms2m_consumer.py",
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
	for name, script := range pythonImages {
		img, err := d.pythonImage(filepath.Join(repo, script))
		if err != nil {
			return fmt.Errorf("image %s: %w", name, err)
		}
		if _, err := reg.Push(ctx, imageRef(name), img); err != nil {
			return err
		}
	}
	return nil
}

// publishPython builds the Python consumer's image as the lab runs it
// (building the base layer if the cache has none) and pushes it to ref with
// the keychain of docker's config: how a release publishes it.
func (d dirs) publishPython(ctx context.Context, ref string) error {
	if _, err := os.Stat(d.pythonBase()); err != nil {
		logf("building the Python base layer (Debian's python3 and pika)")
		if err := script(".", "python-rootfs.sh", d.pythonBase()); err != nil {
			return err
		}
	}
	img, err := d.pythonImage(pythonImages["python-consumer"])
	if err != nil {
		return err
	}
	digest, err := image.Registry{Keychain: authn.DefaultKeychain}.Push(ctx, ref, img)
	if err == nil {
		logf("pushed %s", digest)
	}
	return err
}

// pythonImage is the Python base layer with script as /app/<name>, its
// entrypoint.
func (d dirs) pythonImage(script string) (v1.Image, error) {
	base, err := tarball.LayerFromFile(d.pythonBase(), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	code, err := os.ReadFile(script)
	if err != nil {
		return nil, err
	}
	target := "app/" + filepath.Base(script)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "app/", Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: target, Mode: 0o755, Size: int64(len(code))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if _, err := tw.Write(code); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	app, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	return image.OCIImage(func(cfg *v1.ConfigFile) {
		cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
		cfg.Config.Entrypoint = []string{"/usr/bin/python3", "-u", "/" + target}
		cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	}, base, app)
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
		for _, name := range slices.Concat(slices.Collect(maps.Keys(labImages)), slices.Collect(maps.Keys(pythonImages))) {
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
