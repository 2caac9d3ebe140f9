package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
)

// TestDirectTransfer: the source's agent streams an archive to the target's,
// which publishes it unchanged as the layer of a checkpoint image its node
// pulls; the source archive is gone, and neither a push without the token
// nor a read from off the node is served.
func TestDirectTransfer(t *testing.T) {
	archiveDir = t.TempDir()
	t.Cleanup(func() { archiveDir = CheckpointDir })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct := &Direct{Dir: t.TempDir(), Token: "s3cret", Port: port}
	go func() { _ = Serve(ctx, ln, time.Minute, direct) }()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		resp, err := http.Get(base + healthPath)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatal("the direct agent never became ready:", err)
	}
	reader := image.Registry{Insecure: true}
	if _, err := reader.Pull(ctx, direct.local(ProbeImage)); err != nil {
		t.Fatal("probe image not served to the node:", err)
	}

	content := bytes.Repeat([]byte("checkpoint memory "), 100000)
	archive := filepath.Join(archiveDir, "checkpoint-p_ns-app-1.tar")
	if err := os.WriteFile(archive, content, 0o600); err != nil {
		t.Fatal(err)
	}
	req := PackRequest{Archive: archive, Container: "app", SendTo: ln.Addr().String(), Repository: "ns/p", Tag: "app-x1", Token: "s3cret"}
	if _, err := Pack(ctx, PackRequest{Archive: archive, Container: "app", SendTo: req.SendTo, Repository: "ns/p", Tag: "t", Token: "wrong"}, image.Registry{}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a send with a wrong token: %v", err)
	}
	res, err := Pack(ctx, req, image.Registry{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Image, fmt.Sprintf("localhost:%d/ns/p@sha256:", port)) || res.ArchiveBytes != int64(len(content)) {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Fatal("archive still on the source node after the transfer")
	}
	img, err := reader.Pull(ctx, res.Image)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil || m.Annotations[image.CRIOCheckpointAnnotation] != "app" {
		t.Fatalf("manifest %+v %v", m, err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %v %v", layers, err)
	}
	rc, err := layers[0].Compressed()
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, content) {
		t.Fatal("the layer is not the archive, byte for byte")
	}

	// Pushing without the token, and reading from off the node, are refused.
	if _, err := (image.Registry{Insecure: true}).Push(ctx, direct.local("ns/evil:x"), img); err == nil {
		t.Fatal("a push without the token was accepted")
	}
	h, err := Handler(nil, func() {}, direct, nil)
	if err != nil {
		t.Fatal(err)
	}
	off := httptest.NewRequest(http.MethodGet, "/v2/ns/p/manifests/"+res.Image[strings.Index(res.Image, "@")+1:], nil)
	off.RemoteAddr = "10.88.1.7:41000"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, off)
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("a read from another host: %d", rec.Code)
	}
}
