package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
)

// How a received checkpoint becomes an image the target's runtime pulls: stored,
// published by tag, and the pulls that wait for a publication.

// store writes the size bytes of the archive from conn (those already read
// first) to a new file in blobs, then publishes the image of ref made of it
// in the background.
func (d *Direct) store(conn net.Conn, buffered *bufio.Reader, size int64, blobs, ref, container string, publishing *publishing) (PackResult, error) {
	f, err := os.CreateTemp(blobs, "receive-*")
	if err != nil {
		return PackResult{}, err
	}
	n, err := io.CopyN(f, buffered, min(int64(buffered.Buffered()), size))
	// TLS hands over at most a record per read: filled reads into a large
	// buffer keep the writes to the file large.
	buf := make([]byte, 1<<20)
	for err == nil && n < size {
		// A sender silent this long is gone; without a deadline a
		// hijacked connection would wait for it forever.
		_ = conn.SetReadDeadline(time.Now().Add(receiveIdle))
		want := min(receiveChunk, size-n)
		var k int64
		k, err = io.CopyBuffer(struct{ io.Writer }{f}, fillingReader{io.LimitReader(conn, want)}, buf)
		if err == nil && k < want {
			err = io.ErrUnexpectedEOF // the sender closed early
		}
		n += k
	}
	if err != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
		return PackResult{}, fmt.Errorf("receive archive (%d of %d bytes): %w", n, size, err)
	}
	published := publishing.begin(ref)
	received := time.Now()
	d.publishes.Go(func() {
		err := d.publish(f, n, blobs, ref, container)
		published(err)
		if err != nil {
			log.Printf("publish %s: %v", ref, err)
			return
		}
		log.Printf("published %s (%d bytes) %v after its last byte", ref, n, time.Since(received).Round(time.Millisecond))
	})
	// The node pulls it by tag: that read waits for the publication.
	return PackResult{Image: d.local(ref), ArchiveBytes: n}, nil
}

// answer writes a response on a hijacked connection and ends it.
func answer(conn net.Conn, status int, contentType string, body []byte) {
	resp := http.Response{
		StatusCode:    status,
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": {contentType}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Close:         true,
	}
	_ = conn.SetWriteDeadline(time.Now().Add(receiveIdle))
	_ = resp.Write(conn)
}

// publish names the received layer by its hash and pushes the checkpoint
// image's config and manifest to the agent's registry (the layer is there
// already).
func (d *Direct) publish(f *os.File, n int64, blobs, ref, container string) error {
	defer os.Remove(f.Name()) // a no-op once renamed
	h := sha256.New()
	_, err := io.CopyBuffer(h, io.NewSectionReader(f, 0, n), make([]byte, 1<<20))
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("hash the received archive: %w", err)
	}
	digest := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	// The disk blob handler's layout: the registry serves it from there.
	layerPath := filepath.Join(blobs, digest.Algorithm, digest.Hex)
	if err := os.MkdirAll(filepath.Dir(layerPath), 0o700); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), layerPath); err != nil {
		return err
	}
	img, err := imageOf(image.FileLayer{Path: layerPath, Hash: digest, Len: n}, container)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = d.registry().Push(ctx, d.local(ref), img)
	return err
}

// publishing tracks the images being published after their transfer, so
// that the node's pull of one waits for it rather than finding nothing.
type publishing struct {
	mu      sync.Mutex
	pending map[string]*publication // by repository:tag
}

type publication struct {
	done chan struct{}
	err  error
}

// publishWait bounds how long a pull waits for its image's publication.
const publishWait = 2 * time.Minute

// begin marks ref as being published; the returned func ends it.
func (p *publishing) begin(ref string) func(error) {
	pub := &publication{done: make(chan struct{})}
	p.mu.Lock()
	p.pending[ref] = pub
	p.mu.Unlock()
	return func(err error) {
		pub.err = err
		close(pub.done)
		p.mu.Lock()
		if err == nil && p.pending[ref] == pub {
			delete(p.pending, ref) // published: the registry answers from now on
		}
		p.mu.Unlock()
	}
}

// waitFor holds the node's read of a manifest being published until it is
// (or says why it never will be). Requests with credentials are the
// publication's own push, which looks for the manifest first: they pass.
func (p *publishing) waitFor(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repo, ref, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/"), "/manifests/")
		user, _, _ := r.BasicAuth()
		if !ok || user == pushUser || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			next.ServeHTTP(w, r)
			return
		}
		p.mu.Lock()
		pub := p.pending[repo+":"+ref]
		p.mu.Unlock()
		if pub != nil {
			started := time.Now()
			select {
			case <-pub.done:
			case <-r.Context().Done():
				return
			case <-time.After(publishWait):
				http.Error(w, "the checkpoint image is still being published", http.StatusServiceUnavailable)
				return
			}
			if pub.err != nil {
				http.Error(w, "the checkpoint image could not be published: "+pub.err.Error(), http.StatusInternalServerError)
				return
			}
			log.Printf("a read of %s:%s waited %v for its publication", repo, ref, time.Since(started).Round(time.Millisecond))
		}
		next.ServeHTTP(w, r)
	})
}

// publishProbe puts ProbeImage in the agent's own registry.
func (d *Direct) publishProbe(ctx context.Context) error {
	img, err := image.ProbeImage()
	if err != nil {
		return err
	}
	_, err = d.registry().Push(ctx, d.local(ProbeImage), img)
	return err
}
