package appctl

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// apiServer stands in for the API server's pod proxy in front of one
// application: requests to /api/v1/namespaces/ns/pods/p:8080/proxy/... reach
// the consumer's real handler.
func apiServer(t *testing.T, app http.Handler) Client {
	const prefix = "/api/v1/namespaces/ns/pods/p:8080/proxy"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, prefix+"/") {
			http.NotFound(w, r)
			return
		}
		r.URL.Path = strings.TrimPrefix(r.URL.Path, prefix)
		app.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return Client{REST: cs.CoreV1().RESTClient()}
}

func TestClientSpeaksTheContract(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), protocol.TokenKey)
	if err := os.WriteFile(tokenFile, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	consumer := ms2m.NewConsumer(ms2m.ConsumerConfig{Queue: "work", TokenFile: tokenFile})
	c := apiServer(t, consumer.Handler())
	target := Target{Namespace: "ns", Pod: "p", Port: 8080, Token: "s3cret"}
	ctx := context.Background()

	// The token travels through the API server's proxy in its own header.
	if _, err := c.Control(ctx, Target{Namespace: "ns", Pod: "p", Port: 8080, Token: "guess"}, protocol.Control{Type: protocol.Prepare}); err == nil || !strings.Contains(err.Error(), "refused the call") || !strings.Contains(err.Error(), protocol.ControlSecret) {
		t.Fatalf("a call with the wrong token: %v", err)
	}

	st, err := c.State(ctx, target)
	if err != nil || st.Mode != protocol.ModePrimary || st.Process == "" {
		t.Fatalf("state %+v %v", st, err)
	}
	st, err = c.Control(ctx, target, protocol.Control{Type: protocol.Prepare})
	if err != nil || !st.PendingRestore {
		t.Fatalf("prepare %+v %v", st, err)
	}
	if _, err := c.Control(ctx, target, protocol.Control{Type: "BOGUS"}); err == nil || !strings.Contains(err.Error(), "unknown control message type") {
		t.Fatalf("bogus control: %v", err)
	}
	if _, err := c.AppliedAfter(ctx, target, protocol.Position{}); !errors.Is(err, ErrNotApplied) {
		t.Fatalf("applied after 0: %v", err)
	}
	if _, err := c.State(ctx, Target{Namespace: "ns", Pod: "other", Port: 8080}); err == nil || !strings.Contains(err.Error(), "ms2m.io/control-port") {
		t.Fatalf("unreachable app: %v", err)
	}
}
