package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
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

// TestCopyHashing: what is copied arrives whole and its digest is the
// SHA-256 of all of it, across many chunks.
func TestCopyHashing(t *testing.T) {
	data := make([]byte, 5*copyBuffer+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var got bytes.Buffer
	n, sum, err := copyHashing(&got, bytes.NewReader(data))
	want := sha256.Sum256(data)
	if err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) || !bytes.Equal(sum, want[:]) {
		t.Fatalf("copied %d of %d bytes (equal %t), sum %x, want %x: %v", n, len(data), bytes.Equal(got.Bytes(), data), sum, want, err)
	}
	if _, _, err := copyHashing(&got, iotest.ErrReader(errors.New("connection reset"))); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("a failed source: %v", err)
	}
}

// BenchmarkReceiveCopy compares what receive does with a received archive
// (write it to disk, hashing it on its own goroutine) against a plain write
// and a write that hashes in line: the hash should hide behind the write
// (go test -bench ReceiveCopy ./pkg/agent).
func BenchmarkReceiveCopy(b *testing.B) {
	chunk := make([]byte, copyBuffer)
	for i := range chunk {
		chunk[i] = byte(i*31 + i>>8)
	}
	const size = 256 << 20
	for _, tc := range []struct {
		name string
		copy func(dst io.Writer, src io.Reader) error
	}{
		{"plain", func(dst io.Writer, src io.Reader) error {
			_, err := io.CopyBuffer(dst, src, make([]byte, copyBuffer))
			return err
		}},
		{"hash-in-line", func(dst io.Writer, src io.Reader) error {
			_, err := io.CopyBuffer(io.MultiWriter(dst, sha256.New()), src, make([]byte, copyBuffer))
			return err
		}},
		{"hash-overlapped", func(dst io.Writer, src io.Reader) error {
			_, _, err := copyHashing(dst, src)
			return err
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(size)
			for range b.N {
				f, err := os.CreateTemp(b.TempDir(), "receive-*")
				if err != nil {
					b.Fatal(err)
				}
				if err := tc.copy(f, io.LimitReader(&repeatedChunk{chunk: chunk}, size)); err != nil {
					b.Fatal(err)
				}
				_ = f.Close()
				_ = os.Remove(f.Name())
			}
		})
	}
}

// repeatedChunk reads chunk over and over.
type repeatedChunk struct {
	chunk []byte
	off   int
}

func (r *repeatedChunk) Read(p []byte) (int, error) {
	n := copy(p, r.chunk[r.off:])
	r.off = (r.off + n) % len(r.chunk)
	return n, nil
}
