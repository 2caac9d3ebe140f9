package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/sample"
	"github.com/kubectl-migrate/kubectl-migrate/test/testenv"
)

// scratch is a broker topology of the test's own, reached by the
// application through a proxy the check can cut.
type scratch struct {
	url, appURL, exchange, queue string
	proxy                        *testenv.CutProxy
}

func newScratch(t *testing.T) scratch {
	s := scratch{url: testenv.AMQPURL(t), exchange: testenv.Name("conf"), queue: testenv.Name("conf")}
	s.proxy, s.appURL = testenv.CutProxyFor(t, s.url)
	return s
}

func (s scratch) check(t *testing.T, app App) []Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return Run(ctx, Env{App: app, URL: s.url, Exchange: s.exchange, Queue: s.queue, Cut: s.proxy.Cut, Timeout: 15 * time.Second},
		func(r Result) {
			switch {
			case r.Skip != "":
				t.Logf("- %s: %s", r.Clause, r.Skip)
			case r.Err != nil:
				t.Logf("✗ %s: %v", r.Clause, r.Err)
			default:
				t.Logf("✓ %s", r.Clause)
			}
		})
}

// serveGo runs a Go consumer of the sample application, its endpoint
// wrapped by wrap, until the test ends.
func serveGo(t *testing.T, s scratch, wrap func(http.Handler) http.Handler) Endpoint {
	var sum sample.Sum
	c := ms2m.NewConsumer(ms2m.ConsumerConfig{URL: s.appURL, Exchange: s.exchange, Queue: s.queue, Logf: t.Logf,
		Handle: sum.Handler(0), AppState: sum.State})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	srv := httptest.NewServer(wrap(c.Handler()))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return Endpoint{URL: srv.URL, Token: testToken}
}

// requireAllKept fails unless every clause was kept but the live
// migration, which needs a cluster (the lab's e2e checks it).
func requireAllKept(t *testing.T, results []Result) {
	t.Helper()
	for _, r := range results {
		if r.Err != nil || (r.Skip != "" && r.Clause != "migrates live by checkpoint and restore") {
			t.Fatalf("clause %q not kept: %v%s", r.Clause, r.Err, r.Skip)
		}
	}
}

func TestTheGoSDKKeepsTheContract(t *testing.T) {
	s := newScratch(t)
	requireAllKept(t, s.check(t, serveGo(t, s, func(h http.Handler) http.Handler { return h })))
}

// TestPythonConsumerKeepsTheContract runs examples/python, a consumer that
// shares no code with this repository's Go, through every clause.
func TestPythonConsumerKeepsTheContract(t *testing.T) {
	python := testenv.Require(t, "MIGRATE_TEST_PYTHON", `eval "$(bash test/services.sh up)"`)
	s := newScratch(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	// go test runs in the package's directory.
	script := filepath.Join("..", "..", "examples", "python", "ms2m_consumer.py")
	var logs bytes.Buffer
	cmd := exec.Command(python, script, "--url", s.appURL, "--exchange", s.exchange, "--queue", s.queue, "--listen", addr)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("the consumer's log:\n%s", logs.String())
		}
	})
	app := Endpoint{URL: "http://" + addr, Token: testToken}
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := app.State(ctx)
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the Python consumer never answered at %s", addr)
	}
	requireAllKept(t, s.check(t, app))
}

// TestAConsumerThatIgnoresSTOPFails: the check catches a broken consumer —
// one that answers STOP as if it had stopped and goes on consuming — at
// that clause, having passed the ones before it.
func TestAConsumerThatIgnoresSTOPFails(t *testing.T) {
	s := newScratch(t)
	ignoresStop := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// It checks the token (the clause before STOP's), then
			// ignores STOP.
			if r.URL.Path == protocol.ControlPath && r.Header.Get(protocol.TokenHeader) == testToken {
				body, _ := io.ReadAll(r.Body)
				var msg protocol.Control
				if json.Unmarshal(body, &msg) == nil && msg.Type == protocol.Stop {
					rec := httptest.NewRecorder()
					get := httptest.NewRequest(http.MethodGet, protocol.StatePath, nil)
					get.Header = r.Header
					h.ServeHTTP(rec, get)
					var st protocol.State
					_ = json.Unmarshal(rec.Body.Bytes(), &st)
					st.Mode = protocol.ModeHold // says it stopped
					w.Header().Set("Content-Type", "application/json")
					_ = json.NewEncoder(w).Encode(st)
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			h.ServeHTTP(w, r)
		})
	}
	results := s.check(t, serveGo(t, s, ignoresStop))
	for _, r := range results {
		if strings.HasPrefix(r.Clause, "STOP") {
			if r.Err == nil {
				t.Fatal("a consumer that ignores STOP passed the STOP clause")
			}
			break
		}
		if r.Err != nil {
			t.Fatalf("clause %q failed before the STOP clause: %v", r.Clause, r.Err)
		}
	}
	if !Failed(results) {
		t.Fatal("the check passed a broken consumer")
	}
}
