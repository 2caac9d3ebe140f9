package agent

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestServeAnswersAndEndsWhenIdle: a warm agent answers its health check,
// refuses a malformed or oversized request, and ends on its own once nobody asks for
// anything (its migration died).
func TestServeAnswersAndEndsWhenIdle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), ln, 500*time.Millisecond, nil) }()
	base := "http://" + ln.Addr().String()
	resp, err := http.Get(base + healthPath)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Post(base+packPath, "application/json", strings.NewReader("{"))
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("malformed pack: %v %v", resp, err)
	}
	resp.Body.Close()
	// A body past the bound is refused, not read into memory.
	huge := `{"archive":"` + strings.Repeat("a", 2*maxRequestBytes) + `"}`
	resp, err = http.Post(base+packPath, "application/json", strings.NewReader(huge))
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("oversized pack: %v %v", resp, err)
	}
	resp.Body.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the idle agent did not end")
	}
}
