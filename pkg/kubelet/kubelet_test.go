package kubelet

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
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
	return Client{REST: cs.CoreV1().RESTClient(), Retry: wait.Backoff{Steps: 5, Duration: time.Millisecond}}
}

func TestCheckpointCallsTheNodeProxy(t *testing.T) {
	var gotPath, gotTimeout, gotMethod string
	c := client(t, func(w http.ResponseWriter, r *http.Request) {
		gotMethod, gotPath, gotTimeout = r.Method, r.URL.Path, r.URL.Query().Get("timeout")
		_, _ = w.Write([]byte(`{"items":["/var/lib/kubelet/checkpoints/checkpoint-p_ns-app-2026.tar"]}`))
	})
	path, err := c.Checkpoint(context.Background(), "node-a", "ns", "p", "app", 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if gotMethod != http.MethodPost || gotPath != "/api/v1/nodes/node-a/proxy/checkpoint/ns/p/app" {
		t.Fatalf("%s %s", gotMethod, gotPath)
	}
	if gotTimeout != "2" {
		t.Fatalf("timeout=%q: the kubelet takes whole seconds", gotTimeout)
	}
	if path != "/var/lib/kubelet/checkpoints/checkpoint-p_ns-app-2026.tar" {
		t.Fatal(path)
	}
}

func TestCheckpointErrorsNameTheFix(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   string
	}{
		{http.StatusNotFound, "404 page not found", "ContainerCheckpoint"},
		{http.StatusInternalServerError, "rpc error: unknown method CheckpointContainer", "unknown method CheckpointContainer"},
		{http.StatusForbidden, `{"kind":"Status","code":403,"message":"forbidden"}`, "create on nodes/proxy"},
		{http.StatusInternalServerError, "criu failed: Connected TCP socket, consider using --tcp-established", "tcp-close"},
	} {
		c := client(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		})
		_, err := c.Checkpoint(context.Background(), "node-a", "ns", "p", "app", time.Second)
		var explained *CheckpointError
		if !errors.As(err, &explained) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%d: got %v, want an explained error naming %q", tc.status, err, tc.want)
		}
	}
	if remedy := CheckpointRemedy(errors.New("dial tcp 10.0.0.1:10250: connection refused")); !strings.Contains(remedy, "tcp-close in /etc/criu/runc.conf") {
		t.Errorf("an unexplained failure's remedy %q names no usual cause", remedy)
	}
}

// TestCheckpointTriesAgainAfterARuntimeFailure: a dump CRIU refused (a
// probe's connection arrived while the container was frozen) is asked for
// again, up to five times; after the fifth the error names the usual cause
// and its cure.
func TestCheckpointTriesAgainAfterARuntimeFailure(t *testing.T) {
	for _, tc := range []struct {
		failures, wantCalls int
		wantErr             string
	}{
		{failures: 1, wantCalls: 2},
		{failures: 4, wantCalls: 5},
		{failures: 5, wantCalls: 5, wantErr: "CRIU failed 5 times"},
	} {
		calls := 0
		c := client(t, func(w http.ResponseWriter, r *http.Request) {
			if calls++; calls <= tc.failures {
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte("criu failed: type NOTIFY errno 0\nlog file: /var/lib/containers/x/userdata/dump.log"))
				return
			}
			_, _ = w.Write([]byte(`{"items":["/var/lib/kubelet/checkpoints/checkpoint-p_ns-app-2026.tar"]}`))
		})
		path, err := c.Checkpoint(context.Background(), "node-a", "ns", "p", "app", time.Second)
		if calls != tc.wantCalls {
			t.Errorf("%d failures: %d calls, want %d", tc.failures, calls, tc.wantCalls)
		}
		if tc.wantErr == "" {
			if err != nil || !strings.HasSuffix(path, "checkpoint-p_ns-app-2026.tar") {
				t.Errorf("%d failures: path %q, err %v", tc.failures, path, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "skip-in-flight in /etc/criu/runc.conf") || !strings.Contains(err.Error(), "dump.log") {
			t.Errorf("%d failures: %v", tc.failures, err)
		}
	}
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
