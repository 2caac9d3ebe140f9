package ms2m

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// TestEndpointsAskForTheToken: a call to an /ms2m/ path without the
// namespace's token (or with another) changes nothing and reads nothing;
// with it, it is served; the health endpoints stay open for probes.
func TestEndpointsAskForTheToken(t *testing.T) {
	c := NewConsumer(ConsumerConfig{Queue: "q"})
	h := c.Handler()
	call := func(method, path, token, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		if token != "" {
			r.Header.Set(protocol.TokenHeader, token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, token := range []string{"", "guess", testToken + "x"} {
		for _, r := range []struct{ method, path, body string }{
			{http.MethodPost, protocol.ControlPath, `{"type":"STOP"}`},
			{http.MethodPost, protocol.ControlPath, `{"type":"PREPARE","payload":{"target":"attacker/thief"}}`},
			{http.MethodGet, protocol.StatePath, ""},
			{http.MethodGet, protocol.AppliedPath + "?after=0", ""},
		} {
			if w := call(r.method, r.path, token, r.body); w.Code != http.StatusUnauthorized || !strings.Contains(w.Body.String(), protocol.ControlSecret) {
				t.Errorf("%s %s with token %q: %d %s", r.method, r.path, token, w.Code, w.Body)
			}
		}
	}
	if st := c.State(); st.PendingRestore || len(st.Homes) != 1 {
		t.Fatalf("refused calls changed the state: %+v", st)
	}
	if w := call(http.MethodPost, protocol.ControlPath, testToken, `{"type":"PREPARE","payload":{"target":"team/consumer-x1"}}`); w.Code != http.StatusOK || !c.State().PendingRestore {
		t.Fatalf("PREPARE with the token: %d %s", w.Code, w.Body)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if w := call(http.MethodGet, path, "", ""); w.Code != http.StatusOK {
			t.Errorf("%s without a token: %d", path, w.Code)
		}
	}
}

// TestNoTokenNoService: an application started without its token serves
// no control call and does not consume, saying what to mount.
func TestNoTokenNoService(t *testing.T) {
	missing := filepath.Join(t.TempDir(), protocol.TokenKey)
	c := NewConsumer(ConsumerConfig{Queue: "q", TokenFile: missing, Handle: func(context.Context, Delivery) error { return nil }})
	err := c.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), protocol.ControlSecret) || !strings.Contains(err.Error(), missing) {
		t.Fatalf("Run without a token: %v", err)
	}
	r := httptest.NewRequest(http.MethodGet, protocol.StatePath, nil)
	r.Header.Set(protocol.TokenHeader, testToken)
	w := httptest.NewRecorder()
	c.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("state without a token mounted: %d %s", w.Code, w.Body)
	}
	p := NewProducer(ProducerConfig{TokenFile: tokenFileWith(t, "p-token")})
	r = httptest.NewRequest(http.MethodPost, protocol.ControlPath, strings.NewReader(`{"type":"STOP"}`))
	w = httptest.NewRecorder()
	p.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("a producer's STOP without its token: %d %s", w.Code, w.Body)
	}
}
