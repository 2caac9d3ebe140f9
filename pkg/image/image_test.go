package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubectl-migrate/kubectl-migrate/test/testenv"
)

// WriteArchive writes a tar shaped like a kubelet checkpoint archive and
// returns its path and contents.
func writeArchive(t *testing.T, dir string) (string, map[string]string) {
	t.Helper()
	files := map[string]string{
		"config.dump":            `{"id":"abc","name":"app"}`,
		"spec.dump":              `{"ociVersion":"1.0.0"}`,
		"checkpoint/pages-1.img": strings.Repeat("\x00memory", 512),
		"rootfs-diff.tar":        "",
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, data := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(data))
	}
	_ = tw.Close()
	path := filepath.Join(dir, "checkpoint-consumer_default-app-2026-11-30T00:00:00Z.tar")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, files
}

// checkCheckpointImage reads img back and checks what restore relies on.
func checkCheckpointImage(t *testing.T, img v1.Image, want map[string]string) {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("media types %s / %s, want OCI (CRI-O refuses mixed images)", m.MediaType, m.Config.MediaType)
	}
	for _, key := range []string{CRIOCheckpointAnnotation, CRIUCheckpointAnnotation} {
		if m.Annotations[key] != "app" {
			t.Errorf("annotation %s = %q, want app", key, m.Annotations[key])
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != goruntime.GOARCH {
		t.Errorf("platform %s/%s", cfg.OS, cfg.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("want one layer, got %d (%v)", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		got[h.Name] = string(data)
	}
	if len(got) != len(want) {
		t.Fatalf("layer holds %d files, want %d", len(got), len(want))
	}
	for name, data := range want {
		if got[name] != data {
			t.Errorf("layer file %s differs", name)
		}
	}
}

// TestCheckpointImageLayout: the archive is the image's one layer as it
// is (uncompressed, its digest its own hash), known once it was pushed.
func TestCheckpointImageLayout(t *testing.T) {
	path, files := writeArchive(t, t.TempDir())
	img, err := CheckpointImage(path, "app")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := Registry{Insecure: true}
	ref, err := reg.Push(context.Background(), strings.TrimPrefix(srv.URL, "http://")+"/layout:app", img)
	if err != nil {
		t.Fatal(err)
	}
	checkCheckpointImage(t, img, files)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	if l := m.Layers[0]; l.MediaType != types.OCIUncompressedLayer || l.Digest.Hex != hex.EncodeToString(sum[:]) || l.Size != int64(len(raw)) {
		t.Errorf("layer %+v is not the archive as it is (sha256 %x, %d bytes)", l, sum, len(raw))
	}
	if d, _ := img.Digest(); !strings.HasSuffix(ref, d.String()) {
		t.Errorf("pushed %s, image digest %s", ref, d)
	}
}

func roundTrip(t *testing.T, host string) {
	path, files := writeArchive(t, t.TempDir())
	img, err := CheckpointImage(path, "app")
	if err != nil {
		t.Fatal(err)
	}
	reg := Registry{Insecure: true}
	ctx := context.Background()
	repo := host + "/" + testenv.Name("ckpt")
	if err := reg.CheckPush(ctx, repo); err != nil {
		t.Fatal(err)
	}
	ref, err := reg.Push(ctx, repo+":app-abcde", img)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ref, "@sha256:") {
		t.Fatalf("push returned %q, want a digest reference", ref)
	}
	pulled, err := reg.Pull(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	checkCheckpointImage(t, pulled, files)
	layers, err := pulled.Layers()
	if err != nil {
		t.Fatal(err)
	}
	archive, err := layers[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Delete(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Pull(ctx, ref); err == nil {
		t.Fatal("image still there after Delete")
	}
	// The archive is the process's memory: its blob goes too.
	blob, err := name.NewDigest(repo+"@"+archive.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := remote.Layer(blob, remote.WithContext(ctx)); err == nil {
		if rc, err := l.Compressed(); err == nil {
			_ = rc.Close()
			t.Fatal("the archive's blob is still in the registry after Delete")
		}
	}
}

func TestRoundTripInProcessRegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	roundTrip(t, strings.TrimPrefix(srv.URL, "http://"))
}

func TestRoundTripRealRegistry(t *testing.T) {
	roundTrip(t, testenv.Registry(t))
}

func TestCheckPushFailsForUnreachableRegistry(t *testing.T) {
	srv := httptest.NewServer(nil)
	host := strings.TrimPrefix(srv.URL, "http://")
	srv.Close() // nothing listens there any more
	err := Registry{Insecure: true}.CheckPush(context.Background(), host+"/ckpt")
	if err == nil || !strings.Contains(err.Error(), "does not accept pushes") {
		t.Fatalf("got %v", err)
	}
}

func TestBinaryImage(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kubectl-migrate-agent")
	if err := os.WriteFile(bin, []byte("\x7fELF fake"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := BinaryImage(bin, "arm64")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := img.ConfigFile()
	if cfg.Architecture != "arm64" || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/usr/local/bin/kubectl-migrate-agent" {
		t.Fatalf("config %+v", cfg.Config)
	}
	layers, _ := img.Layers()
	rc, _ := layers[0].Uncompressed()
	defer rc.Close()
	tr := tar.NewReader(rc)
	found := false
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Name == "usr/local/bin/kubectl-migrate-agent" {
			found = h.Mode == 0o755
		}
	}
	if !found {
		t.Fatal("binary missing or not executable in the layer")
	}
}
