package kubelet

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func client(t *testing.T, h http.HandlerFunc) Client {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return Client{REST: cs.CoreV1().RESTClient()}
}

// TestHealthyTellsTheKubeletFromTheAPIServer: a kubelet the API server
// cannot reach is an API status; an API server that does not answer is not.
func TestHealthyTellsTheKubeletFromTheAPIServer(t *testing.T) {
	var gotPath string
	up := client(t, func(w http.ResponseWriter, r *http.Request) {
		gotPath = r.URL.Path
		_, _ = w.Write([]byte("ok"))
	})
	if err := up.Healthy(context.Background(), "node-b"); err != nil || gotPath != "/api/v1/nodes/node-b/proxy/healthz" {
		t.Fatalf("healthy kubelet: %v (asked %s)", err, gotPath)
	}
	down := client(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json") // before WriteHeader, or it is not sent
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"error trying to reach service: dial tcp 10.0.0.2:10250: connect: connection refused","reason":"ServiceUnavailable","code":503}`))
	})
	var status apierrors.APIStatus
	if err := down.Healthy(context.Background(), "node-b"); !errors.As(err, &status) || !strings.Contains(err.Error(), "node-b") || !strings.Contains(err.Error(), "does not answer: error trying to reach service") {
		t.Fatalf("kubelet away: %v, want an API status naming the node and the API server's reason", err)
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := (Client{REST: cs.CoreV1().RESTClient()}).Healthy(context.Background(), "node-b"); err == nil || errors.As(err, &status) {
		t.Fatalf("API server away: %v, want an error that is no API status", err)
	}
}
