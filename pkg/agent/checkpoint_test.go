package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// fakeCheckpointer is a runtime with running containers that fails its
// first failures checkpoints with failure.
type fakeCheckpointer struct {
	criv1.UnimplementedRuntimeServiceServer
	mu         sync.Mutex
	containers []*criv1.Container
	failures   int
	failure    error
	calls      []*criv1.CheckpointContainerRequest
}

func (f *fakeCheckpointer) ListContainers(_ context.Context, req *criv1.ListContainersRequest) (*criv1.ListContainersResponse, error) {
	var out []*criv1.Container
	for _, c := range f.containers {
		match := req.GetFilter().GetState() == nil || c.State == req.GetFilter().GetState().GetState()
		for k, v := range req.GetFilter().GetLabelSelector() {
			match = match && c.Labels[k] == v
		}
		if match {
			out = append(out, c)
		}
	}
	return &criv1.ListContainersResponse{Containers: out}, nil
}

func (f *fakeCheckpointer) CheckpointContainer(_ context.Context, req *criv1.CheckpointContainerRequest) (*criv1.CheckpointContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls = append(f.calls, req); len(f.calls) <= f.failures {
		return nil, f.failure
	}
	return &criv1.CheckpointContainerResponse{}, nil
}

func serveRuntime(t *testing.T, runtime criv1.RuntimeServiceServer) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	criv1.RegisterRuntimeServiceServer(srv, runtime)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return socket
}

func container(id, ns, pod, uid, name string, state criv1.ContainerState) *criv1.Container {
	return &criv1.Container{Id: id, State: state, Labels: map[string]string{
		podNamespaceLabel: ns, podNameLabel: pod, podUIDLabel: uid, containerNameLabel: name,
	}}
}

var fastRetry = wait.Backoff{Steps: 5, Duration: time.Millisecond}

// TestCheckpointAsksTheRuntimeForTheNamedContainer: the running container
// of the pod with that UID is checkpointed, into an archive named as the
// kubelet names it (ArchivePattern matches it), with the timeout in whole
// seconds; an exited one, another pod's of the same name (another UID) and
// another container of the pod are not.
func TestCheckpointAsksTheRuntimeForTheNamedContainer(t *testing.T) {
	runtime := &fakeCheckpointer{containers: []*criv1.Container{
		container("old", "ns", "p", "uid-1", "app", criv1.ContainerState_CONTAINER_EXITED),
		container("other-pod", "ns", "p", "uid-0", "app", criv1.ContainerState_CONTAINER_RUNNING),
		container("sidecar", "ns", "p", "uid-1", "proxy", criv1.ContainerState_CONTAINER_RUNNING),
		container("this", "ns", "p", "uid-1", "app", criv1.ContainerState_CONTAINER_RUNNING),
	}}
	socket := serveRuntime(t, runtime)
	res, err := checkpointContainer(context.Background(), socket, "", CheckpointRequest{Namespace: "ns", Pod: "p", UID: "uid-1", Container: "app", TimeoutSeconds: 2}, fastRetry)
	if err != nil {
		t.Fatal(err)
	}
	if len(runtime.calls) != 1 || runtime.calls[0].ContainerId != "this" || runtime.calls[0].Timeout != 2 || runtime.calls[0].Location != res.Archive {
		t.Fatalf("calls %v, result %+v", runtime.calls, res)
	}
	if ok, _ := filepath.Match(ArchivePattern("ns", "p", "app"), res.Archive); !ok {
		t.Fatalf("archive %s does not match the kubelet's pattern %s", res.Archive, ArchivePattern("ns", "p", "app"))
	}

	_, err = checkpointContainer(context.Background(), socket, "", CheckpointRequest{Namespace: "ns", Pod: "p", UID: "uid-2", Container: "app"}, fastRetry)
	var se statusError
	if !errors.As(err, &se) || se.status != 404 || len(runtime.calls) != 1 {
		t.Fatalf("a pod UID the node does not run: %v (%d calls)", err, len(runtime.calls))
	}
}

// TestCheckpointTriesAgainAfterARuntimeFailure: a dump CRIU refused (a
// probe's connection arrived while the container was frozen) is asked for
// again, up to five times; a refusal that no retry changes (the runtime
// does not checkpoint) is not.
func TestCheckpointTriesAgainAfterARuntimeFailure(t *testing.T) {
	criuFailed := status.Error(codes.Unknown, "failed to checkpoint container this: criu failed: type NOTIFY errno 0\nlog file: /var/lib/containers/x/userdata/dump.log")
	for _, tc := range []struct {
		failures, wantCalls int
		failure             error
		wantErr             string
	}{
		{failures: 1, wantCalls: 2, failure: criuFailed},
		{failures: 4, wantCalls: 5, failure: criuFailed},
		{failures: 5, wantCalls: 5, failure: criuFailed, wantErr: "failed 5 time(s)"},
		{failures: 5, wantCalls: 1, failure: status.Error(codes.Unimplemented, "unknown method CheckpointContainer"), wantErr: "unknown method CheckpointContainer"},
	} {
		runtime := &fakeCheckpointer{failures: tc.failures, failure: tc.failure, containers: []*criv1.Container{
			container("this", "ns", "p", "uid-1", "app", criv1.ContainerState_CONTAINER_RUNNING),
		}}
		res, err := checkpointContainer(context.Background(), serveRuntime(t, runtime), "", CheckpointRequest{Namespace: "ns", Pod: "p", Container: "app"}, fastRetry)
		if len(runtime.calls) != tc.wantCalls || res.Tries != tc.wantCalls {
			t.Errorf("%v ×%d: %d calls (%d reported), want %d", tc.failure, tc.failures, len(runtime.calls), res.Tries, tc.wantCalls)
		}
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("%d failures: %v", tc.failures, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "dump.log") && tc.failure == criuFailed {
			t.Errorf("%v ×%d: %v", tc.failure, tc.failures, err)
		}
	}
}

// TestCheckpointErrorsNameTheFix: what the agent answers for a failed
// checkpoint becomes one finding with the change that cures it.
func TestCheckpointErrorsNameTheFix(t *testing.T) {
	req := CheckpointRequest{Namespace: "ns", Pod: "p", Container: "app"}
	for answer, want := range map[string]string{
		"the runtime failed 1 time(s): unknown method CheckpointContainer":                                  "enable_criu_support",
		"the runtime failed 5 time(s): criu failed: Connected TCP socket, consider using --tcp-established": "tcp-close",
		"the runtime failed 5 time(s): criu failed: type NOTIFY errno 0":                                    "skip-in-flight in /etc/criu/runc.conf",
	} {
		err := explainCheckpoint("node-a", req, errors.New("agent kubectl-migrate-agent-x: "+answer))
		var explained *CheckpointError
		if !errors.As(err, &explained) || !strings.Contains(explained.Remedy, want) || !strings.Contains(explained.Finding, "checkpoint p/app on node node-a") {
			t.Errorf("%q: got %v, want a remedy naming %q", answer, err, want)
		}
	}
	if err := explainCheckpoint("node-a", req, errors.New("agent x: no running container app of pod ns/p on this node (the runtime lists 0)")); errors.As(err, new(*CheckpointError)) {
		t.Errorf("a container that is not there is no runtime failure: %v", err)
	}
	if remedy := CheckpointRemedy(errors.New("dial tcp 10.0.0.1:8090: connection refused")); !strings.Contains(remedy, "tcp-close in /etc/criu/runc.conf") {
		t.Errorf("an unexplained failure's remedy %q names no usual cause", remedy)
	}
}

// lazyRuntime takes the lazy request at each checkpoint and serves the
// pages, as the kubectl-migrate runtime does, if it is the container's.
type lazyRuntime struct {
	fakeCheckpointer
	stage string
	ours  bool
}

func (f *lazyRuntime) CheckpointContainer(ctx context.Context, req *criv1.CheckpointContainerRequest) (*criv1.CheckpointContainerResponse, error) {
	id := ociruntime.Identity{Namespace: "ns", Pod: "p", UID: "uid-1", Container: "app"}
	if f.ours && os.Remove(ociruntime.LazyRequestPath(f.stage, id)) == nil {
		if err := os.MkdirAll(filepath.Dir(ociruntime.PagesSocket(f.stage, id)), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(ociruntime.PagesSocket(f.stage, id), nil, 0o600); err != nil {
			return nil, err
		}
	}
	return f.fakeCheckpointer.CheckpointContainer(ctx, req)
}

// TestALazyCheckpointIsAskedOfTheRuntimeAndConfirmed: the agent asks for
// lazy pages at the checkpoint, and reports them only where the runtime
// took the request; another runtime's whole checkpoint leaves no request
// behind for a later one.
func TestALazyCheckpointIsAskedOfTheRuntimeAndConfirmed(t *testing.T) {
	for _, ours := range []bool{true, false} {
		stage := t.TempDir()
		runtime := &lazyRuntime{fakeCheckpointer: fakeCheckpointer{containers: []*criv1.Container{
			container("this", "ns", "p", "uid-1", "app", criv1.ContainerState_CONTAINER_RUNNING),
		}}, stage: stage, ours: ours}
		req := CheckpointRequest{Namespace: "ns", Pod: "p", UID: "uid-1", Container: "app", LazyPages: true}
		res, err := checkpointContainer(context.Background(), serveRuntime(t, runtime), stage, req, fastRetry)
		if err != nil {
			t.Fatal(err)
		}
		if res.LazyPages != ours {
			t.Errorf("runtime ours=%v: lazy %v", ours, res.LazyPages)
		}
		if _, err := os.Stat(ociruntime.LazyRequestPath(stage, ociruntime.Identity{Namespace: "ns", Pod: "p", UID: "uid-1", Container: "app"})); !os.IsNotExist(err) {
			t.Errorf("runtime ours=%v: the request outlived the checkpoint: %v", ours, err)
		}
		// Nothing but the pages' own directory is left in the stage.
		entries, _ := os.ReadDir(stage)
		for _, e := range entries {
			if e.Name() != ociruntime.PagesDir {
				t.Errorf("runtime ours=%v: %s left in the stage", ours, e.Name())
			}
		}
	}
	if _, err := checkpointContainer(context.Background(), serveRuntime(t, &fakeCheckpointer{}), "", CheckpointRequest{Namespace: "ns", Pod: "p", Container: "app", LazyPages: true}, fastRetry); err == nil {
		t.Error("a lazy checkpoint without the pod's UID or the stage")
	}
}
