package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
)

// A transfer without a registry: the source node's agent streams the
// checkpoint archive to the target node's agent, which keeps it as the
// layer of a checkpoint image in a registry of its own that only its node
// reads (localhost:DirectPort). The archive crosses the network once,
// unchanged, and never leaves the two nodes.

// Paths of a direct-transfer agent.
const (
	receivePath = "/receive"
	// ProbeImage is a tiny image every direct-transfer agent serves, which
	// preflight has the node pull to prove its runtime pulls from the agent.
	ProbeImage = "kubectl-migrate/probe:ready"
)

// TokenEnv carries a direct-transfer agent's push token.
const TokenEnv = "KUBECTL_MIGRATE_TOKEN"

// pushUser is the user name of the push credential; the token is its
// password.
const pushUser = "kubectl-migrate"

// Direct configures a serving agent as a direct-transfer target.
type Direct struct {
	// Dir holds the received layers.
	Dir string
	// Token is what a sender must present: anyone who can reach the node's
	// port could otherwise push. Reading needs no token but is served to
	// the node itself (loopback) only: the images hold process memory.
	Token string
	// Port is the one the agent listens on; 0 means DirectPort.
	Port int
}

func (d Direct) local(path string) string {
	port := d.Port
	if port == 0 {
		port = DirectPort
	}
	return fmt.Sprintf("localhost:%d/%s", port, path)
}

// registry pushes to the agent's own registry.
func (d Direct) registry() image.Registry {
	return image.Registry{Insecure: true, Keychain: staticKeychain{authn.FromConfig(authn.AuthConfig{Username: pushUser, Password: d.Token})}}
}

// handler serves the registry and the receive endpoint behind the checks.
func (d Direct) handler() (http.Handler, error) {
	blobs := filepath.Join(d.Dir, "blobs")
	if err := os.MkdirAll(blobs, 0o700); err != nil {
		return nil, err
	}
	reg := ggcrregistry.New(ggcrregistry.WithBlobHandler(statByName{dir: blobs, disk: ggcrregistry.NewDiskBlobHandler(blobs)}), ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	mux := http.NewServeMux()
	mux.Handle("/v2/", d.guard(reg))
	mux.Handle("PUT "+receivePath, d.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, err := d.receive(r, blobs)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
	})))
	return mux, nil
}

// statByName is the disk blob handler, but for Stat, which it answers from
// the file's size instead of hashing the whole blob again (the disk handler
// does, at every HEAD and before every GET: two more passes over a
// checkpoint). A blob's name is its digest: receive hashed it as it arrived,
// and the registry verifies what is pushed to it before storing it.
type statByName struct {
	dir  string
	disk ggcrregistry.BlobHandler
}

func (b statByName) Get(ctx context.Context, repo string, h v1.Hash) (io.ReadCloser, error) {
	return b.disk.Get(ctx, repo, h)
}

func (b statByName) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	fi, err := os.Stat(filepath.Join(b.dir, h.Algorithm, h.Hex))
	if errors.Is(err, os.ErrNotExist) {
		return 0, ggcrregistry.ErrNotFound
	}
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

func (b statByName) Put(ctx context.Context, repo string, h v1.Hash, rc io.ReadCloser) error {
	return b.disk.(ggcrregistry.BlobPutHandler).Put(ctx, repo, h, rc)
}

// guard lets through requests with the push token, and reads from the node
// itself.
func (d Direct) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pass, ok := r.BasicAuth(); ok && subtle.ConstantTimeCompare([]byte(pass), []byte(d.Token)) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="kubectl-migrate"`)
		http.Error(w, "this agent serves its own node; senders need the migration's token", http.StatusUnauthorized)
	})
}

// receive stores the archive in the body as a layer, hashing it on the way,
// and publishes the checkpoint image made of it in the agent's registry.
func (d Direct) receive(r *http.Request, blobs string) (PackResult, error) {
	q := r.URL.Query()
	repository, tag, container := q.Get("repository"), q.Get("tag"), q.Get("container")
	if repository == "" || tag == "" || container == "" {
		return PackResult{}, errors.New("receive needs repository, tag and container")
	}
	start := time.Now()
	f, err := os.CreateTemp(blobs, "receive-*")
	if err != nil {
		return PackResult{}, err
	}
	defer os.Remove(f.Name()) // a no-op once renamed
	n, sum, err := copyHashing(f, r.Body)
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return PackResult{}, fmt.Errorf("receive archive: %w", err)
	}
	digest := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum)}
	// The disk blob handler's layout: the registry serves it from there.
	layerPath := filepath.Join(blobs, digest.Algorithm, digest.Hex)
	if err := os.MkdirAll(filepath.Dir(layerPath), 0o700); err != nil {
		return PackResult{}, err
	}
	if err := os.Rename(f.Name(), layerPath); err != nil {
		return PackResult{}, err
	}
	received := time.Now()
	// Hashed as it arrived: not read again to be published.
	img, err := image.CheckpointImageOf(image.FileLayer{Path: layerPath, Hash: digest, Len: n}, container)
	if err != nil {
		return PackResult{}, err
	}
	// Only the config and the manifest go up: the registry has the layer.
	pushed, err := d.registry().Push(r.Context(), d.local(repository+":"+tag), img)
	if err != nil {
		return PackResult{}, err
	}
	return PackResult{
		Image:        pushed, // by digest, as the node pulls it
		ArchiveBytes: n,
		PushMillis:   received.Sub(start).Milliseconds(),
		BuildMillis:  time.Since(received).Milliseconds(),
	}, nil
}

// copyBuffer is the size of the chunks received archives are copied in.
const copyBuffer = 1 << 20

// copyHashing copies src to dst and returns the SHA-256 of what it copied.
// The hash runs on its own goroutine over the chunk just written while the
// next one is received and written, so that hashing overlaps the copy
// instead of adding to it; two buffers take turns, nothing is copied twice.
func copyHashing(dst io.Writer, src io.Reader) (int64, []byte, error) {
	h := sha256.New()
	written := make(chan []byte)
	free := make(chan []byte, 2)
	free <- make([]byte, copyBuffer)
	free <- make([]byte, copyBuffer)
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		for chunk := range written {
			h.Write(chunk)
			free <- chunk[:cap(chunk)]
		}
	}()
	var n int64
	var err error
	for err == nil {
		buf := <-free
		k, readErr := io.ReadFull(src, buf)
		if k > 0 {
			if _, err = dst.Write(buf[:k]); err != nil {
				break
			}
			n += int64(k)
			written <- buf[:k]
		}
		if readErr == io.EOF || readErr == io.ErrUnexpectedEOF {
			break
		}
		err = readErr
	}
	close(written)
	<-hashed
	return n, h.Sum(nil), err
}

// send streams the archive to the target node's agent (the direct
// transfer's Pack).
func send(ctx context.Context, req PackRequest) (PackResult, error) {
	f, err := os.Open(req.Archive)
	if err != nil {
		return PackResult{}, fmt.Errorf("checkpoint archive: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return PackResult{}, err
	}
	q := url.Values{"repository": {req.Repository}, "tag": {req.Tag}, "container": {req.Container}}
	u := url.URL{Scheme: "http", Host: req.SendTo, Path: receivePath, RawQuery: q.Encode()}
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), f)
	if err != nil {
		return PackResult{}, err
	}
	httpReq.ContentLength = fi.Size()
	httpReq.SetBasicAuth(pushUser, req.Token)
	resp, err := http.DefaultClient.Do(httpReq)
	if err != nil {
		return PackResult{}, fmt.Errorf("send the checkpoint to the target node's agent at %s: %w", req.SendTo, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return PackResult{}, fmt.Errorf("the target node's agent at %s refused the checkpoint: %s %s", req.SendTo, resp.Status, bytes.TrimSpace(body))
	}
	var res PackResult
	if err := json.Unmarshal(body, &res); err != nil {
		return PackResult{}, fmt.Errorf("the target node's agent answered %q: %w", body, err)
	}
	return res, nil
}

// publishProbe puts ProbeImage in the agent's own registry.
func (d Direct) publishProbe(ctx context.Context) error {
	img, err := image.ProbeImage()
	if err != nil {
		return err
	}
	_, err = d.registry().Push(ctx, d.local(ProbeImage), img)
	return err
}

// staticKeychain answers every registry with one authenticator.
type staticKeychain struct{ auth authn.Authenticator }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return k.auth, nil }

// isDirect tells a direct transfer's pack request from a registry push.
func (req PackRequest) isDirect() bool { return strings.TrimSpace(req.SendTo) != "" }
