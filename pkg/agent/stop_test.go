package agent

import (
	"context"
	"slices"
	"sync"
	"testing"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeSandboxes is a runtime's sandboxes; late ones appear only after the
// first list, as a sandbox still being created when the kubelet died would.
type fakeSandboxes struct {
	criv1.UnimplementedRuntimeServiceServer
	mu      sync.Mutex
	ready   []*criv1.PodSandbox
	late    []*criv1.PodSandbox
	stopped []string
}

func (f *fakeSandboxes) ListPodSandbox(_ context.Context, req *criv1.ListPodSandboxRequest) (*criv1.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var items []*criv1.PodSandbox
	for _, sb := range f.ready {
		if sb.Labels[podUIDLabel] == req.GetFilter().GetLabelSelector()[podUIDLabel] {
			items = append(items, sb)
		}
	}
	f.ready, f.late = append(f.ready, f.late...), nil
	return &criv1.ListPodSandboxResponse{Items: items}, nil
}

func (f *fakeSandboxes) StopPodSandbox(_ context.Context, req *criv1.StopPodSandboxRequest) (*criv1.StopPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, req.PodSandboxId)
	return &criv1.StopPodSandboxResponse{}, nil
}

func (f *fakeSandboxes) RemovePodSandbox(_ context.Context, req *criv1.RemovePodSandboxRequest) (*criv1.RemovePodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.stopped, req.PodSandboxId) {
		return nil, context.Canceled // removing a running sandbox would be a bug here
	}
	f.ready = slices.DeleteFunc(f.ready, func(sb *criv1.PodSandbox) bool { return sb.Id == req.PodSandboxId })
	return &criv1.RemovePodSandboxResponse{}, nil
}

// TestStopPodEndsEverySandboxOfThePod: the pod's sandboxes, including one
// that appears after the first look, are stopped and removed; another
// pod's are not touched.
func TestStopPodEndsEverySandboxOfThePod(t *testing.T) {
	sandbox := func(id, uid string) *criv1.PodSandbox {
		return &criv1.PodSandbox{Id: id, Labels: map[string]string{podUIDLabel: uid}}
	}
	runtime := &fakeSandboxes{
		ready: []*criv1.PodSandbox{sandbox("a1", "uid-a"), sandbox("b1", "uid-b")},
		late:  []*criv1.PodSandbox{sandbox("a2", "uid-a")},
	}
	res, err := stopPod(context.Background(), serveRuntime(t, runtime), "uid-a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Sandboxes, []string{"a1", "a2"}) || !slices.Equal(runtime.stopped, []string{"a1", "a2"}) {
		t.Fatalf("stopped %v (reported %v), want a1 and a2", runtime.stopped, res.Sandboxes)
	}
	if len(runtime.ready) != 1 || runtime.ready[0].Id != "b1" {
		t.Fatalf("sandboxes left: %v, want only the other pod's", runtime.ready)
	}
}
