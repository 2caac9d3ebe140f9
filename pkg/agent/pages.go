package agent

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// Lazy pages between two agents. After a lazy checkpoint (the kubectl-migrate
// runtime kept the pages in the frozen source and serves them on the
// source's page socket), the source's agent opens a second stream to the
// target's agent, on the receive port, pinned and with the push token as
// the archive's transfer is; the target's agent joins it to the target's
// page socket, where the runtime's helper for the restore connects. CRIU's
// page traffic thus crosses between the nodes only inside the migration's
// TLS, and neither end's page server is reachable from a network.

const (
	pagesPath = "/pages"
	// pagesUpgrade is the protocol the stream switches to.
	pagesUpgrade = "kubectl-migrate-pages"
	// pagesWait bounds the target's wait for the restore to come for the
	// pages: the runtime's helper waits as long.
	pagesWait = 2 * time.Minute
)

// pagesResultPath asks the target's agent how the lazy restores of
// containers ended.
const pagesResultPath = "/pages-result"

type pagesResultRequest struct {
	Containers []ociruntime.Identity `json:"containers"`
}

// PagesStatus is one container's lazy restore: Ended once its transfer
// ended, well (Done) or not.
type PagesStatus struct {
	Container string `json:"container"`
	Ended     bool   `json:"ended"`
	ociruntime.PagesResult
}

// streamPages joins the source's page socket for the container of
// req.Pages to a stream to the target's agent, until CRIU's session ends.
// It returns once the stream is open; pages flows in the background.
func (d *Direct) streamPages(ctx context.Context, req PackRequest) error {
	if d == nil || d.StageDir == "" {
		return errors.New("this agent was started without the node's stage, where the lazy checkpoint's pages wait")
	}
	if req.StageAs == nil {
		return errors.New("lazy pages go only to a checkpoint staged for the kubectl-migrate runtime")
	}
	source, err := net.DialTimeout("unix", ociruntime.PagesSocket(d.StageDir, *req.Pages), 10*time.Second)
	if err != nil {
		return fmt.Errorf("the pages of %s/%s %s wait nowhere on this node (was it checkpointed lazily?): %w", req.Pages.Namespace, req.Pages.Pod, req.Pages.Container, err)
	}
	target, err := dialPages(ctx, req)
	if err != nil {
		source.Close()
		return err
	}
	d.publishes.Add(1)
	go func() {
		defer d.publishes.Done()
		ociruntime.Bridge(source, target)
	}()
	return nil
}

// dialPages opens the page stream to the target's agent: TLS pinned to its
// certificate, the push token, then the switch to the raw stream.
func dialPages(ctx context.Context, req PackRequest) (net.Conn, error) {
	if req.CertSHA256 == "" {
		return nil, errors.New("a page stream needs the target agent's certificate fingerprint")
	}
	dialer := tls.Dialer{Config: pinnedTransport(req.CertSHA256).TLSClientConfig}
	conn, err := dialer.DialContext(ctx, "tcp", req.SendTo)
	if err != nil {
		return nil, fmt.Errorf("open the page stream to the target node's agent at %s: %w", req.SendTo, err)
	}
	u := url.URL{Scheme: "https", Host: req.SendTo, Path: pagesPath, RawQuery: url.Values{"stage": {stageQuery(*req.StageAs)}}.Encode()}
	httpReq, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	httpReq.SetBasicAuth(pushUser, req.Token)
	httpReq.Header.Set("Connection", "Upgrade")
	httpReq.Header.Set("Upgrade", pagesUpgrade)
	_ = conn.SetDeadline(time.Now().Add(receiveIdle))
	if err := httpReq.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, httpReq)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		conn.Close()
		return nil, fmt.Errorf("the target node's agent at %s refused the page stream: %s %s", req.SendTo, resp.Status, body)
	}
	_ = conn.SetDeadline(time.Time{})
	return bufferedConn{Conn: conn, r: br}, nil
}

// receivePages is the target's end: it switches the sender's request to
// the raw stream and joins it to the restore's helper on the page socket.
func (d *Direct) receivePages(w http.ResponseWriter, r *http.Request) {
	id, ok := d.stageIdentity(w, r.URL.Query().Get("stage"))
	if !ok {
		return
	}
	if d.StageDir == "" {
		http.Error(w, "this agent stages no checkpoints (it was started without --stage)", http.StatusConflict)
		return
	}
	socket := ociruntime.PagesSocket(d.StageDir, id.Unbound())
	if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_ = os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	conn, buffered, err := http.NewResponseController(w).Hijack()
	if err != nil {
		ln.Close()
		return
	}
	_, _ = fmt.Fprintf(conn, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", pagesUpgrade)
	d.publishes.Add(1)
	go func() {
		defer d.publishes.Done()
		defer os.Remove(socket)
		sender := bufferedConn{Conn: conn, r: buffered.Reader}
		_ = ln.(*net.UnixListener).SetDeadline(time.Now().Add(pagesWait))
		restorer, err := ln.Accept()
		ln.Close()
		if err != nil {
			// The restore never came: closing ends the source's session,
			// which resumes the source.
			log.Printf("pages of %s/%s %s: no restore asked for them: %v", id.Namespace, id.Pod, id.Container, err)
			sender.Close()
			return
		}
		ociruntime.Bridge(restorer, sender)
	}()
}

// pagesResults reads how the lazy restores of ids ended.
func (d *Direct) pagesResults(ids []ociruntime.Identity) ([]PagesStatus, error) {
	if d == nil || d.StageDir == "" {
		return nil, statusError{http.StatusConflict, "this agent stages no checkpoints"}
	}
	out := make([]PagesStatus, 0, len(ids))
	for _, id := range ids {
		res, ended, err := ociruntime.ReadPagesResult(d.StageDir, id.Unbound())
		if err != nil {
			return nil, err
		}
		out = append(out, PagesStatus{Container: id.Container, Ended: ended, PagesResult: res})
	}
	return out, nil
}

// PagesResults asks node's agent how the lazy restores of ids ended.
func (l Launcher) PagesResults(ctx context.Context, node string, ids []ociruntime.Identity) ([]PagesStatus, error) {
	warm, ok := l.Serving.pod(node)
	if !ok {
		return nil, fmt.Errorf("no agent serves on %s", node)
	}
	out, err := l.call(ctx, warm, http.MethodPost, pagesResultPath, pagesResultRequest{Containers: ids})
	if err != nil {
		return nil, err
	}
	return decodeAnswer[[]PagesStatus](node, out)
}

// bufferedConn reads what the HTTP exchange buffered before the stream.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
