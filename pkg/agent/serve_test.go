package agent

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

const testToken = "the-migrations-token"

// post calls the agent; 0 if it cannot be reached (it ended).
func post(t *testing.T, url, token, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set(ControlTokenHeader, token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestServeAnswersAndEndsWhenIdle: a warm agent answers its health check,
// refuses a malformed or oversized request, and ends on its own once nobody asks for
// anything (its migration died).
func TestServeAnswersAndEndsWhenIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), ln, 500*time.Millisecond, nil, testToken, "ns") }()
	base := "http://" + ln.Addr().String()
	resp, err := http.Get(base + healthPath)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	if code := post(t, base+packPath, testToken, "{"); code != http.StatusBadRequest {
		t.Fatalf("malformed pack: %d", code)
	}
	// A body past the bound is refused, not read into memory.
	huge := `{"archive":"` + strings.Repeat("a", 2*maxRequestBytes) + `"}`
	if code := post(t, base+packPath, testToken, huge); code != http.StatusBadRequest {
		t.Fatalf("oversized pack: %d", code)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the idle agent did not end")
	}
}

// TestServeTakesCallsOnlyFromItsMigration: every call but the health check
// needs the migration's control token; one without it, or with another, is
// refused before it does anything, and does not keep the agent alive.
func TestServeTakesCallsOnlyFromItsMigration(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), ln, time.Second, nil, testToken, "ns") }()
	base := "http://" + ln.Addr().String()
	calls := map[string]string{packPath: `{}`, pullPath: `{"images":["x"]}`, runtimePath: `{}`, stopPodPath: `{"uid":"u"}`, checkpointPath: `{"namespace":"ns","pod":"p","container":"app"}`, removePath: `{"archives":["/var/lib/kubelet/checkpoints/*"]}`}
	deadline := time.Now().Add(3 * time.Second) // the attacker keeps calling past the idle time
	for time.Now().Before(deadline) {
		for path, body := range calls {
			for _, token := range []string{"", "guess"} {
				if code := post(t, base+path, token, body); code != http.StatusUnauthorized && code != 0 {
					t.Fatalf("%s with token %q: %d, want 401", path, token, code)
				}
			}
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return // ended on time: refused calls are no activity
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("refused calls kept the agent alive past its idle time")
}

// TestServeWithoutATokenTakesNoCalls: an agent started without a token
// (an old launcher, a hand-made pod) refuses every call.
func TestServeWithoutATokenTakesNoCalls(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = Serve(ctx, ln, time.Minute, nil, "", "ns") }()
	if code := post(t, "http://"+ln.Addr().String()+runtimePath, "", `{}`); code != http.StatusForbidden {
		t.Fatalf("runtime without a configured token: %d, want 403", code)
	}
}
