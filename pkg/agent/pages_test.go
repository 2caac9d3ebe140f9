package agent

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// shortStage is a stage directory whose sockets' paths fit (107 bytes).
func shortStage(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// pageServer stands for the source runtime's helper: it answers the first
// line it reads with memory, then waits for the end of the session, which
// ended reports.
func pageServer(t *testing.T, stage string, id ociruntime.Identity, memory string) (ended chan error) {
	t.Helper()
	socket := ociruntime.PagesSocket(stage, id)
	if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ended = make(chan error, 1)
	go func() {
		defer ln.Close()
		c, err := ln.Accept()
		if err != nil {
			ended <- err
			return
		}
		defer c.Close()
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "pages?\n" {
			ended <- fmt.Errorf("the page server read %q, %v", line, err)
			return
		}
		fmt.Fprintln(c, memory)
		_, err = io.Copy(io.Discard, c)
		ended <- err
	}()
	return ended
}

// TestPagesTravelBetweenTheAgentsOverTheMigrationsStream: the source's
// agent joins the source's page socket to a pinned, token-bearing stream
// to the target's agent, which joins it to the target's page socket, where
// the restore's helper asks for the pages; no one else gets a stream.
func TestPagesTravelBetweenTheAgentsOverTheMigrationsStream(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	target, addr := startDirect(ctx, t)
	target.StageDir, target.Scope = shortStage(t), "shop"
	source := &Direct{StageDir: shortStage(t)}
	src := ociruntime.Identity{Namespace: "shop", Pod: "consumer-2", UID: "uid-1", Container: "app"}
	dst := ociruntime.Identity{Namespace: "shop", Pod: "consumer-2-x", UID: "uid-2", Container: "app"}
	ended := pageServer(t, source.StageDir, src, "the process's memory")

	// Whoever reaches the receive port without the token, or names a pod
	// of another namespace, gets no stream.
	for name, c := range map[string]struct {
		auth, stage string
		want        int
	}{
		"no token":          {"", stageQuery(dst), http.StatusUnauthorized},
		"a guessed token":   {pushUser + ":guess", stageQuery(dst), http.StatusUnauthorized},
		"another namespace": {pushUser + ":s3cret", "other/victim/app/uid-9", http.StatusForbidden},
	} {
		if got := pagesStatus(t, addr, c.auth, c.stage); got != c.want {
			t.Errorf("%s: %d, want %d", name, got, c.want)
		}
	}

	req := PackRequest{SendTo: addr, Token: "s3cret", CertSHA256: target.CertSHA256(), StageAs: &dst, Pages: &src}
	if err := source.streamPages(ctx, req); err != nil {
		t.Fatal(err)
	}
	// The restore's helper on the target.
	restorer, err := ociruntime.DialWithin(ociruntime.PagesSocket(target.StageDir, dst.Unbound()), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(restorer, "pages?\n")
	got, err := bufio.NewReader(restorer).ReadString('\n')
	if err != nil || got != "the process's memory\n" {
		t.Fatalf("the restore got %q, %v", got, err)
	}
	restorer.Close()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the source's page session did not end when the restore hung up")
	}
	source.publishes.Wait()
}

// TestAStreamWithoutLazyPagesIsRefused: no pages wait on the source node
// (the checkpoint was whole, or another runtime's): the sender says so.
func TestAStreamWithoutLazyPagesIsRefused(t *testing.T) {
	source := &Direct{StageDir: shortStage(t)}
	id := ociruntime.Identity{Namespace: "shop", Pod: "p", UID: "u", Container: "app"}
	err := source.streamPages(context.Background(), PackRequest{SendTo: "127.0.0.1:1", StageAs: &id, Pages: &id})
	if err == nil {
		t.Fatal("a stream of pages that wait nowhere")
	}
}

func pagesStatus(t *testing.T, addr, auth, stage string) int {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	header := ""
	if auth != "" {
		header = "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(auth)) + "\r\n"
	}
	fmt.Fprintf(conn, "GET %s?stage=%s HTTP/1.1\r\nHost: x\r\n%sConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", pagesPath, stage, header, pagesUpgrade)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode
}
