package appctl

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
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
	consumer := ms2m.NewConsumer(ms2m.ConsumerConfig{Queue: "work"})
	c := apiServer(t, consumer.Handler())
	target := Target{Namespace: "ns", Pod: "p", Port: 8080}
	ctx := context.Background()

	st, err := c.State(ctx, target)
	if err != nil || st.Mode != ms2m.ModePrimary || st.Process == "" {
		t.Fatalf("state %+v %v", st, err)
	}
	st, err = c.Control(ctx, target, ms2m.Control{Type: ms2m.Prepare})
	if err != nil || !st.PendingRestore {
		t.Fatalf("prepare %+v %v", st, err)
	}
	if _, err := c.Control(ctx, target, ms2m.Control{Type: "BOGUS"}); err == nil || !strings.Contains(err.Error(), "unknown control message type") {
		t.Fatalf("bogus control: %v", err)
	}
	if _, err := c.AppliedAfter(ctx, target, ms2m.Position{}); !errors.Is(err, ErrNotApplied) {
		t.Fatalf("applied after 0: %v", err)
	}
	if _, err := c.State(ctx, Target{Namespace: "ns", Pod: "other", Port: 8080}); err == nil || !strings.Contains(err.Error(), "ms2m.io/control-port") {
		t.Fatalf("unreachable app: %v", err)
	}
}
