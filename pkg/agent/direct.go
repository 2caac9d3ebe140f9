package agent

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
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

// PullUser is the user name of the read credential the node's runtime pulls
// checkpoint images with (PullPassword).
const PullUser = "kubectl-migrate-pull"

// PullPassword is the read credential of the agent whose push token is
// token: derived from it, so the migration needs no second secret, and
// whoever holds it (the target pod's pull secret, in the application's
// namespace) can neither derive the push token nor push. The kubelet
// records which pull secret brought an image in, so with credentials on
// every read, a pod of another namespace that names the image on the node
// must pull it itself, and is refused (KEP-2535).
func PullPassword(token string) string {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("kubectl-migrate pull"))
	return hex.EncodeToString(mac.Sum(nil))
}

// DirectReceivePort is where a direct-transfer target takes the archive
// from the source node's agent: TLS with a key of its own, whose
// certificate's fingerprint the migration pins for the sender.
const DirectReceivePort = 8093

// Direct configures a serving agent as a direct-transfer target.
type Direct struct {
	// Dir holds the received layers.
	Dir string
	// Token is what a sender must present: anyone who can reach the node's
	// port could otherwise push. Reads are served to the node itself
	// (loopback) only, with PullPassword(Token): the images hold process
	// memory.
	Token string
	// Port is the one the agent's registry listens on; 0 means DirectPort.
	Port int
	// StageDir, if set, is where checkpoints sent for staging
	// (PackRequest.StageAs) are extracted: ociruntime.StageDir, mounted.
	StageDir string
	// Scope is the namespace whose containers staged checkpoints may be
	// for.
	Scope Scope
	// Receive is the listener senders reach (DirectReceivePort on the
	// node's network); Serve speaks TLS on it with cert.
	Receive net.Listener
	cert    tls.Certificate
	// touch, set by Serve, is called for each request that authenticated:
	// only the migration's own traffic keeps the agent from its idle end.
	touch func()

	// The registry and the receive endpoint share what is being published.
	once            sync.Once
	registryHandler http.Handler
	receiveHandler  http.Handler
	handlersErr     error
	// publishes are the received archives still being published: Serve
	// waits for them, so an agent that ends leaves no half-written blob.
	publishes sync.WaitGroup
}

// NewDirect makes a direct-transfer target receiving on receive, with a
// key and self-signed certificate of its own: senders pin its fingerprint,
// which the migration reads through the API server, so no CA is involved
// and nobody on the network between the nodes reads or alters a checkpoint.
func NewDirect(dir, token string, receive net.Listener) (*Direct, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "kubectl-migrate direct transfer"},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(24 * time.Hour), // an agent lives one migration
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return &Direct{Dir: dir, Token: token, Receive: receive, cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}}, nil
}

// CertSHA256 is the fingerprint (hex SHA-256 of the DER certificate) a
// sender pins.
func (d *Direct) CertSHA256() string {
	if len(d.cert.Certificate) == 0 {
		return ""
	}
	sum := sha256.Sum256(d.cert.Certificate[0])
	return hex.EncodeToString(sum[:])
}

// DirectInfo is what a direct-transfer target tells the migration: the
// certificate its sender pins.
type DirectInfo struct {
	CertSHA256 string `json:"certSHA256"`
}

// receiveServer serves the receive endpoint over TLS on d.Receive.
func (d *Direct) receiveServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{d.cert}, MinVersion: tls.VersionTLS13},
		// HTTP/1.1 only: receive takes the connection over (HTTP/2 has no
		// hijacking).
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
}

// pinnedTransport trusts exactly the certificate whose fingerprint is pin.
func pinnedTransport(pin string) *http.Transport {
	return &http.Transport{TLSClientConfig: &tls.Config{
		MinVersion: tls.VersionTLS13,
		// No CA vouches for the agent: the pin does, checked below.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the target node's agent showed no certificate")
			}
			sum := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if got := hex.EncodeToString(sum[:]); got != pin {
				return fmt.Errorf("the target node's agent showed certificate %s, not the migration's %s: something else answers at its address", got[:16], pin[:min(16, len(pin))])
			}
			return nil
		},
	}}
}

func (d *Direct) local(path string) string {
	return fmt.Sprintf("localhost:%d/%s", cmp.Or(d.Port, DirectPort), path)
}

// registry pushes to the agent's own registry.
func (d *Direct) registry() image.Registry {
	return image.Registry{Insecure: true, Keychain: staticKeychain{authn.FromConfig(authn.AuthConfig{Username: pushUser, Password: d.Token})}}
}

// handlers serve the registry (to the node) and the receive endpoint (to
// senders), behind the checks.
func (d *Direct) handlers() (registry, receive http.Handler, err error) {
	d.once.Do(func() { d.registryHandler, d.receiveHandler, d.handlersErr = d.newHandlers() })
	return d.registryHandler, d.receiveHandler, d.handlersErr
}

func (d *Direct) newHandlers() (registry, receive http.Handler, err error) {
	blobs := filepath.Join(d.Dir, "blobs")
	if err := os.MkdirAll(blobs, 0o700); err != nil {
		return nil, nil, err
	}
	reg := ggcrregistry.New(ggcrregistry.WithBlobHandler(statByName{dir: blobs, disk: ggcrregistry.NewDiskBlobHandler(blobs)}), ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	publishing := &publishing{pending: map[string]*publication{}}
	mux := http.NewServeMux()
	mux.Handle("PUT "+receivePath, d.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.receive(w, r, blobs, publishing)
	})))
	mux.Handle("GET "+pagesPath, d.guard(http.HandlerFunc(d.receivePages)))
	return d.guard(publishing.waitFor(reg)), mux, nil
}

// statByName is the disk blob handler, but for Stat, which it answers from
// the file's size instead of hashing the whole blob again (the disk handler
// does, at every HEAD and before every GET: two more passes over a
// checkpoint). A blob's name is its digest: publish hashed a received
// archive before naming it so, and the registry verifies what is pushed to
// it before storing it.
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

// guard lets through requests with the push token, and reads with the pull
// credential from the node itself.
func (d *Direct) guard(next http.Handler) http.Handler {
	pull := PullPassword(d.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, _ := r.BasicAuth()
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		pusher := user == pushUser && subtle.ConstantTimeCompare([]byte(pass), []byte(d.Token)) == 1
		puller := user == PullUser && subtle.ConstantTimeCompare([]byte(pass), []byte(pull)) == 1
		if ip := net.ParseIP(host); pusher || (puller && ip != nil && ip.IsLoopback() && (r.Method == http.MethodGet || r.Method == http.MethodHead)) {
			if d.touch != nil {
				d.touch()
			}
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("WWW-Authenticate", `Basic realm="kubectl-migrate"`)
		http.Error(w, "this agent serves its own node's pulls with the migration's pull secret, and senders with its token", http.StatusUnauthorized)
	})
}

// receive stores the archive in the body as a layer and answers as soon as
// the last byte is on disk; the checkpoint image made of it is published in
// the agent's registry (as repository:tag) once the layer's hash is known,
// while the kubelet sets up the target pod's sandbox, and a pull of the
// image that comes sooner waits for it (waitFor). Hashing in the stream
// would make the transfer SHA-256's speed, slower than a node-to-node copy;
// reading the body through net/http would copy every byte through user
// space: the body is spliced from the connection to the file instead.
func (d *Direct) receive(w http.ResponseWriter, r *http.Request, blobs string, publishing *publishing) {
	q := r.URL.Query()
	repository, tag, container := q.Get("repository"), q.Get("tag"), q.Get("container")
	var stageAs *ociruntime.Identity
	if s := q.Get("stage"); s != "" {
		id, ok := d.stageIdentity(w, s)
		if !ok {
			return
		}
		stageAs = &id
	}
	if repository == "" || tag == "" || container == "" {
		http.Error(w, "receive needs repository, tag and container", http.StatusBadRequest)
		return
	}
	if r.ContentLength <= 0 {
		http.Error(w, "receive needs the archive's length", http.StatusLengthRequired)
		return
	}
	if ok, free := spaceFor(blobs, r.ContentLength); !ok {
		http.Error(w, fmt.Sprintf("an archive of %d bytes does not fit on this node, which has %d bytes free and keeps a reserve", r.ContentLength, free), http.StatusInsufficientStorage)
		return
	}
	conn, buffered, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "receive: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer conn.Close()
	start := time.Now()
	var res PackResult
	if stageAs != nil {
		res, err = d.stage(conn, buffered.Reader, r.ContentLength, *stageAs)
	} else {
		res, err = d.store(conn, buffered.Reader, r.ContentLength, blobs, repository+":"+tag, container, publishing)
	}
	if err != nil {
		answer(conn, http.StatusInternalServerError, "text/plain; charset=utf-8", []byte(err.Error()+"\n"))
		return
	}
	res.PushMillis = time.Since(start).Milliseconds()
	body, _ := json.Marshal(res)
	answer(conn, http.StatusOK, "application/json", body)
}

const (
	receiveChunk = 16 << 20
	receiveIdle  = 30 * time.Second
)

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
	if req.StageAs != nil {
		q.Set("stage", stageQuery(*req.StageAs))
	}
	if req.CertSHA256 == "" {
		return PackResult{}, errors.New("a direct transfer needs the target agent's certificate fingerprint to send to")
	}
	u := url.URL{Scheme: "https", Host: req.SendTo, Path: receivePath, RawQuery: q.Encode()}
	httpReq, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), f)
	if err != nil {
		return PackResult{}, err
	}
	httpReq.ContentLength = fi.Size()
	httpReq.SetBasicAuth(pushUser, req.Token)
	transport := pinnedTransport(req.CertSHA256)
	defer transport.CloseIdleConnections()
	resp, err := (&http.Client{Transport: transport}).Do(httpReq)
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

// staticKeychain answers every registry with one authenticator.
type staticKeychain struct{ auth authn.Authenticator }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return k.auth, nil }

// isDirect tells a direct transfer's pack request from a registry push.
func (req PackRequest) isDirect() bool { return strings.TrimSpace(req.SendTo) != "" }
