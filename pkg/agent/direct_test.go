package agent

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// TestDirectTransfer: the source's agent streams an archive to the target's,
// which publishes it unchanged as the layer of a checkpoint image its node
// pulls; the source archive is gone, and neither a push without the token
// nor a read from off the node is served.
func TestDirectTransfer(t *testing.T) {
	archiveDir = t.TempDir()
	t.Cleanup(func() { archiveDir = CheckpointDir })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct, addr := startDirect(ctx, t)
	port := direct.Port
	reader := nodeReader(direct)

	content := bytes.Repeat([]byte("checkpoint memory "), 1_000_000) // more than one receiveChunk
	archive := filepath.Join(archiveDir, "checkpoint-p_ns-app-1.tar")
	if err := os.WriteFile(archive, content, 0o600); err != nil {
		t.Fatal(err)
	}
	req := PackRequest{Archive: archive, Container: "app", SendTo: addr, Repository: "ns/p", Tag: "app-x1", Token: "s3cret", CertSHA256: direct.CertSHA256()}
	if _, err := Pack(ctx, PackRequest{Archive: archive, Container: "app", SendTo: req.SendTo, Repository: "ns/p", Tag: "t", Token: "wrong", CertSHA256: req.CertSHA256}, image.Registry{}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a send with a wrong token: %v", err)
	}
	res, err := Pack(ctx, req, image.Registry{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Image != fmt.Sprintf("localhost:%d/ns/p:app-x1", port) || res.ArchiveBytes != int64(len(content)) {
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

	// Pushing without the token (or with the pull credential), reading
	// without the pull credential, and reading from off the node, are
	// refused.
	if _, err := (image.Registry{Insecure: true}).Push(ctx, direct.local("ns/evil:x"), img); err == nil {
		t.Fatal("a push without the token was accepted")
	}
	if _, err := reader.Push(ctx, direct.local("ns/evil:x"), img); err == nil {
		t.Fatal("a push with the pull credential was accepted")
	}
	var refused *transport.Error
	if _, err := (image.Registry{Insecure: true}).Pull(ctx, res.Image); !errors.As(err, &refused) || refused.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a read from the node without the pull credential: %v", err)
	}
	h, err := Handler(nil, func() {}, direct, nil, "control", "ns")
	if err != nil {
		t.Fatal(err)
	}
	off := httptest.NewRequest(http.MethodGet, "/v2/ns/p/manifests/"+"app-x1", nil)
	off.RemoteAddr = "10.88.1.7:41000"
	off.SetBasicAuth(PullUser, PullPassword(direct.Token))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, off)
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("a read from another host: %d", rec.Code)
	}
}

// nodeReader reads from d's registry as its node's runtime does: from
// loopback, with the pull credential of the target pod's pull secret.
func nodeReader(d *Direct) image.Registry {
	return image.Registry{Insecure: true, Keychain: staticKeychain{authn.FromConfig(authn.AuthConfig{Username: PullUser, Password: PullPassword(d.Token)})}}
}

// startDirect serves a direct-transfer agent on loopback until ctx ends and
// waits until it serves its probe image.
func startDirect(ctx context.Context, tb testing.TB) (*Direct, string) {
	direct, ln, receive := newDirect(tb)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = Serve(ctx, ln, time.Hour, direct, "control", "ns")
	}()
	tb.Cleanup(func() { <-served }) // the caller's cancel comes first
	reader := nodeReader(direct)
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := reader.Pull(ctx, direct.local(ProbeImage))
		return err == nil, nil
	}); err != nil {
		tb.Fatal("the direct agent never served its probe image:", err)
	}
	return direct, receive.Addr().String()
}

// newDirect is a direct-transfer target on loopback, with its agent's
// listener (ln) and its receive port's, not yet served.
func newDirect(tb testing.TB) (direct *Direct, ln, receive net.Listener) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	receive, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	if direct, err = NewDirect(tb.TempDir(), "s3cret", receive); err != nil {
		tb.Fatal(err)
	}
	direct.Port = ln.Addr().(*net.TCPAddr).Port
	return direct, ln, receive
}

// TestReceiveFromASenderThatDies: a sender gone in the middle of an
// archive leaves nothing on the target node, and no image.
func TestReceiveFromASenderThatDies(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct, addr := startDirect(ctx, t)
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT %s?repository=ns/p&tag=app-1&container=app HTTP/1.1\r\nHost: x\r\nAuthorization: Basic %s\r\nContent-Length: %d\r\n\r\n",
		receivePath, base64.StdEncoding.EncodeToString([]byte(pushUser+":s3cret")), 64<<20)
	if _, err := conn.Write(make([]byte, 5<<20)); err != nil {
		t.Fatal(err)
	}
	receiving := func() ([]string, error) { return filepath.Glob(filepath.Join(direct.Dir, "blobs", "receive-*")) }
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		files, err := receiving()
		return len(files) == 1, err
	}); err != nil {
		t.Fatal("the agent never started receiving:", err)
	}
	conn.Close()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		files, err := receiving()
		return len(files) == 0, err
	}); err != nil {
		t.Fatal("the part received is still on disk:", err)
	}
	var unknown *transport.Error
	if _, err := nodeReader(direct).Pull(ctx, direct.local("ns/p:app-1")); !errors.As(err, &unknown) || unknown.StatusCode != http.StatusNotFound {
		t.Fatalf("an image of a transfer that never ended: %v", err)
	}
}

// TestPullWaitsForThePublication: a read of a manifest still being
// published waits for it, and hears why if it failed; other reads pass.
func TestPullWaitsForThePublication(t *testing.T) {
	served := make(chan string, 4)
	p := &publishing{pending: map[string]*publication{}}
	h := p.waitFor(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served <- r.URL.Path }))
	get := func(path string) chan int {
		code := make(chan int, 1)
		go func() {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.SetBasicAuth(PullUser, "a node's read waits too")
			h.ServeHTTP(rec, req)
			code <- rec.Code
		}()
		return code
	}
	done := p.begin("ns/p:app-1")
	waiting := get("/v2/ns/p/manifests/app-1")
	if code := <-get("/v2/ns/other/manifests/app-1"); code != http.StatusOK || <-served != "/v2/ns/other/manifests/app-1" {
		t.Fatalf("another image's read: %d", code)
	}
	select {
	case code := <-waiting:
		t.Fatalf("the read did not wait for the publication: %d", code)
	case <-time.After(100 * time.Millisecond):
	}
	done(nil)
	if code := <-waiting; code != http.StatusOK || <-served != "/v2/ns/p/manifests/app-1" {
		t.Fatalf("the read after the publication: %d", code)
	}

	fail := p.begin("ns/p:app-2")
	fail(errors.New("no space left on device"))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v2/ns/p/manifests/app-2", nil))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "no space left on device") {
		t.Fatalf("a failed publication: %d %s", rec.Code, rec.Body)
	}
}

// BenchmarkDirectTransfer sends a 512 MiB archive from a file to the direct
// transfer's receiver over loopback, beside a plain copy of the same file
// over one TCP connection into another file, alternating (go test -bench
// DirectTransfer ./pkg/agent): the transfer is TLS, the copy plain, so the
// ratio is what encryption and the receiver's work cost on one machine.
// For an image it reports when the sender has its answer (the bytes on the
// target's disk) and when the image is published (the hash known); staged
// for the kubectl-migrate runtime, when the archive is extracted.
func BenchmarkDirectTransfer(b *testing.B) {
	const size = 512 << 20
	// The receiver's log would split the benchmark's result lines.
	log.SetOutput(io.Discard)
	b.Cleanup(func() { log.SetOutput(os.Stderr) })
	archiveDir, stageDir = b.TempDir(), b.TempDir()
	b.Cleanup(func() { archiveDir, stageDir = CheckpointDir, ociruntime.StageDir })
	archive := filepath.Join(archiveDir, "checkpoint-p_ns-app-1.tar")
	if err := writeArchive(archive, size); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct, addr := startDirect(ctx, b)
	direct.StageDir = stageDir
	reader := nodeReader(direct)
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Milliseconds())
	}
	req := func(i int) PackRequest {
		return PackRequest{Archive: archive, Container: "app", SendTo: addr, Repository: "ns/p", Tag: fmt.Sprint("app-", i), Token: "s3cret", CertSHA256: direct.CertSHA256(), KeepArchive: true}
	}
	b.Run("image", func(b *testing.B) {
		var copies, answers, published []time.Duration
		for i := range b.N {
			took, err := plainFileCopy(archive, direct.Dir)
			if err != nil {
				b.Fatal(err)
			}
			copies = append(copies, took)
			start := time.Now()
			res, err := send(ctx, req(i))
			if err != nil {
				b.Fatal(err)
			}
			answers = append(answers, time.Since(start))
			if _, err := reader.Pull(ctx, res.Image); err != nil { // the manifest: it waits for the publication
				b.Fatal(err)
			}
			published = append(published, time.Since(start))
			_ = os.RemoveAll(filepath.Join(direct.Dir, "blobs", "sha256"))
		}
		b.ReportMetric(median(copies), "copy-ms")
		b.ReportMetric(median(answers), "transfer-ms")
		b.ReportMetric(median(published), "published-ms")
		b.ReportMetric(median(answers)/median(copies), "transfer/copy")
	})
	b.Run("stage", func(b *testing.B) {
		var copies, staged []time.Duration
		for i := range b.N {
			took, err := plainFileCopy(archive, direct.Dir)
			if err != nil {
				b.Fatal(err)
			}
			copies = append(copies, took)
			r := req(i)
			r.StageAs = &ociruntime.Identity{Namespace: "ns", Pod: "p", Container: "app"}
			start := time.Now()
			res, err := send(ctx, r)
			if err != nil {
				b.Fatal(err)
			}
			staged = append(staged, time.Since(start))
			if err := os.RemoveAll(ociruntime.StagePath(stageDir, *r.StageAs)); err != nil || res.Staged == "" {
				b.Fatal(res, err)
			}
		}
		b.ReportMetric(median(copies), "copy-ms")
		b.ReportMetric(median(staged), "staged-ms")
		b.ReportMetric(median(staged)/median(copies), "staged/copy")
	})
}

// writeArchive writes a checkpoint archive of about size bytes at path:
// one file of memory pages, as CRIU's is mostly.
func writeArchive(path string, size int64) error {
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*31 + i>>8)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = tw.WriteHeader(&tar.Header{Name: "checkpoint/pages-1.img", Mode: 0o600, Size: size, Typeflag: tar.TypeReg})
	if err == nil {
		_, err = io.Copy(tw, io.LimitReader(&repeatedChunk{chunk: chunk}, size))
	}
	if err == nil {
		err = tw.Close()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	return err
}

// plainFileCopy copies the file at path over one loopback TCP connection
// into a new file in dir, as nc would.
func plainFileCopy(path, dir string) (time.Duration, error) {
	src, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	dst, err := os.CreateTemp(dir, "copy-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(dst.Name()) // dirty pages left to write back would slow the next run
	defer dst.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	received := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, err = io.Copy(dst, c)
			c.Close()
		}
		received <- err
	}()
	start := time.Now()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(c, src)
	c.Close()
	if recvErr := <-received; err == nil {
		err = recvErr
	}
	return time.Since(start), err
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

// TestReceiveRefusesWhatWouldFillTheNode: a sender (even one with the
// token) declaring an archive larger than the node's free space, less a
// reserve, is refused before a byte is written.
func TestReceiveRefusesWhatWouldFillTheNode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct, addr := startDirect(ctx, t)
	if ok, free := spaceFor(direct.Dir, 1); !ok || free < 0 {
		t.Skipf("the test's filesystem has no room or no statfs (free %d)", free)
	}
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT %s?repository=ns/p&tag=app-1&container=app HTTP/1.1\r\nHost: x\r\nAuthorization: Basic %s\r\nContent-Length: %d\r\n\r\n",
		receivePath, base64.StdEncoding.EncodeToString([]byte(pushUser+":s3cret")), int64(1)<<60) // an exbibyte
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusInsufficientStorage || !strings.Contains(string(body), "does not fit on this node") {
		t.Fatalf("%s: %s", resp.Status, body)
	}
	if files, _ := filepath.Glob(filepath.Join(direct.Dir, "blobs", "receive-*")); len(files) != 0 {
		t.Fatalf("wrote %v", files)
	}
}

// TestDirectTransferIsEncryptedAndPinned: the receive port speaks only TLS,
// a sender refuses a target whose certificate is not the pinned one (so it
// never hands the archive or the token to whoever answers at the address),
// and the registry port takes no archive.
func TestDirectTransferIsEncryptedAndPinned(t *testing.T) {
	archiveDir = t.TempDir()
	t.Cleanup(func() { archiveDir = CheckpointDir })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct, addr := startDirect(ctx, t)
	archive := filepath.Join(archiveDir, "checkpoint-p_ns-app-1.tar")
	if err := os.WriteFile(archive, []byte("memory"), 0o600); err != nil {
		t.Fatal(err)
	}
	req := PackRequest{Archive: archive, Container: "app", SendTo: addr, Repository: "ns/p", Tag: "app-1", Token: "s3cret"}

	// Another agent's certificate: a man in the middle, or a stale address.
	other, err := NewDirect(t.TempDir(), "x", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, pin := range []string{other.CertSHA256(), ""} {
		req.CertSHA256 = pin
		if _, err := send(ctx, req); err == nil {
			t.Fatalf("sent pinning %q, not the target's certificate", pin)
		}
	}
	if _, err := os.Stat(archive); err != nil {
		t.Fatal("a refused send lost the archive:", err)
	}
	if files, _ := filepath.Glob(filepath.Join(direct.Dir, "blobs", "receive-*")); len(files) != 0 {
		t.Fatalf("the target received %v from a refused send", files)
	}

	// Plain HTTP to the receive port gets no answer a sender could use.
	resp, err := http.Post("http://"+addr+receivePath, "application/octet-stream", strings.NewReader("memory"))
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("plain HTTP to the receive port: %s", resp.Status)
		}
	}
	// The registry port, which the node's runtime reads in plain HTTP,
	// takes no archive.
	registry := fmt.Sprintf("http://127.0.0.1:%d%s?repository=ns/p&tag=app-1&container=app", direct.Port, receivePath)
	put, _ := http.NewRequestWithContext(ctx, http.MethodPut, registry, strings.NewReader("memory"))
	put.SetBasicAuth(pushUser, "s3cret")
	if resp, err := http.DefaultClient.Do(put); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a send to the registry port: %v %v", resp, err)
	}

	req.CertSHA256 = direct.CertSHA256()
	if _, err := send(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// TestExpectTakesCallsOnlyFromItsMigration: the mark that holds a
// container's create until its checkpoint arrives (/expect), and the
// certificate senders pin (/direct), are given only with the migration's
// control token: a call without it, or with another, marks nothing.
func TestExpectTakesCallsOnlyFromItsMigration(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	receive, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	direct, err := NewDirect(t.TempDir(), "s3cret", receive)
	if err != nil {
		t.Fatal(err)
	}
	direct.StageDir = t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	direct.Port = ln.Addr().(*net.TCPAddr).Port // where it publishes its probe
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, ln, time.Hour, direct, "control", "ns") }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	base := "http://" + ln.Addr().String()
	body := `{"containers":[{"namespace":"ns","pod":"p","container":"app"}]}`
	mark := ociruntime.ExpectedPath(direct.StageDir, ociruntime.Identity{Namespace: "ns", Pod: "p", Container: "app"})
	for _, token := range []string{"", "guess", "s3cret"} { // the push token is not the control token
		if code := post(t, base+expectPath, token, body); code != http.StatusUnauthorized {
			t.Fatalf("/expect with token %q: %d, want 401", token, code)
		}
		if code := post(t, base+directPath, token, `{}`); code != http.StatusUnauthorized {
			t.Fatalf("/direct with token %q: %d, want 401", token, code)
		}
	}
	if _, err := os.Stat(mark); !os.IsNotExist(err) {
		t.Fatalf("a refused call marked %s: %v", mark, err)
	}
	if code := post(t, base+expectPath, "control", body); code != http.StatusOK {
		t.Fatalf("/expect with the control token: %d", code)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Fatalf("the migration's own call marked nothing: %v", err)
	}
}

// TestReceiveTrafficWithoutTheTokenKeepsNoAgentAlive: anyone who reaches a
// node's receive port can send requests to it; refused ones are no
// activity, so the agent still ends once its migration is gone.
func TestReceiveTrafficWithoutTheTokenKeepsNoAgentAlive(t *testing.T) {
	direct, ln, receive := newDirect(t)
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), ln, time.Second, direct, "control", "ns") }()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	url := "https://" + receive.Addr().String() + receivePath + "?repository=ns/p&tag=t&container=app"
	deadline := time.Now().Add(4 * time.Second) // the attacker keeps sending past the idle time
	for time.Now().Before(deadline) {
		for _, pass := range []string{"", "guess"} {
			put, _ := http.NewRequest(http.MethodPut, url, strings.NewReader("memory"))
			if pass != "" {
				put.SetBasicAuth(pushUser, pass)
			}
			if resp, err := client.Do(put); err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("a send with password %q: %s, want 401", pass, resp.Status)
				}
			}
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return // ended on time
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("refused sends to the receive port kept the agent alive past its idle time")
}
