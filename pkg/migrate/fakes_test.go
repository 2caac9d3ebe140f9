package migrate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

var errInjected = errors.New("injected failure")

// world is a fake cluster, broker, registry and application whose parts can
// be told to fail, recording what was done to them.
type world struct {
	t      *testing.T
	client *fake.Clientset
	failAt report.PhaseName

	mu       sync.Mutex
	calls    []string
	queues   map[string]bool
	apps     map[string]*ms2m.State
	archives map[string]bool
	snapshot ms2m.State // the application's memory at the checkpoint
	images   map[string]bool
	saved    []*report.Record
}

func node(name, runtimeVersion string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			NodeInfo:   corev1.NodeSystemInfo{ContainerRuntimeVersion: runtimeVersion},
		},
	}
}

func sourcePod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "default", Labels: map[string]string{"app": "consumer"}},
		Spec: corev1.PodSpec{
			NodeName:   "node-a",
			Containers: []corev1.Container{{Name: "app", Image: "registry/consumer:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
}

func newWorld(t *testing.T, objects ...runtime.Object) *world {
	if len(objects) == 0 {
		objects = []runtime.Object{node("node-a", "cri-o://1.34.0"), node("node-b", "cri-o://1.34.0"), sourcePod()}
	}
	w := &world{
		t: t, client: fake.NewClientset(objects...),
		queues:   map[string]bool{"work": true},
		apps:     map[string]*ms2m.State{"consumer": {Mode: ms2m.ModePrimary, LastSeq: 100, Process: "p1", LastAppliedAt: time.Now()}},
		archives: map[string]bool{}, images: map[string]bool{},
	}
	w.client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authzv1.SelfSubjectAccessReview)
		r.Status.Allowed = true
		return true, r, nil
	})
	w.startKubelet()
	return w
}

func (w *world) record(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, fmt.Sprintf(format, args...))
}

func (w *world) fail(p report.PhaseName) error {
	if w.failAt == p {
		return errInjected
	}
	return nil
}

// startKubelet runs pods created on a node: the restored pod comes up with
// the source's application state, as a restore would bring it.
func (w *world) startKubelet() {
	ctx, cancel := context.WithCancel(context.Background())
	w.t.Cleanup(cancel)
	watcher, err := w.client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	go func() {
		for ev := range watcher.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if ev.Type != watch.Added || !ok || pod.Status.Phase != "" {
				continue
			}
			state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
			if w.failAt == report.Restore {
				state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: "criu failed"}}
			} else {
				w.mu.Lock()
				restored := w.snapshot
				if restored.PendingRestore || restored.Mode == ms2m.ModeHold {
					restored.Mode = ms2m.ModeHold
				}
				w.apps[pod.Name] = &restored
				w.mu.Unlock()
			}
			pod.Status.Phase = corev1.PodRunning
			for _, c := range pod.Spec.Containers {
				pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, State: state})
			}
			_, _ = w.client.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		}
	}()
}

func (w *world) deps() Deps {
	return Deps{
		Client: w.client, Checkpointer: (*fakeCheckpointer)(w), Packer: (*fakePacker)(w),
		DialBroker: func(string) (Broker, error) { return (*fakeBroker)(w), nil },
		App:        (*fakeApp)(w), Registry: (*fakeRegistry)(w), Records: (*fakeStore)(w),
	}
}

type fakeCheckpointer world

func (f *fakeCheckpointer) Checkpoint(_ context.Context, node, ns, pod, ctr string, _ time.Duration) (string, error) {
	w := (*world)(f)
	w.record("checkpoint %s/%s/%s on %s", ns, pod, ctr, node)
	if err := w.fail(report.Checkpoint); err != nil {
		return "", err
	}
	path := agent.CheckpointDir + "/checkpoint-" + pod + "_" + ns + "-" + ctr + ".tar"
	w.mu.Lock()
	w.archives[path] = true
	w.snapshot = *w.apps[pod]
	w.mu.Unlock()
	return path, nil
}

type fakePacker world

func (f *fakePacker) Pack(_ context.Context, podName, node string, req agent.PackRequest) (agent.PackResult, error) {
	w := (*world)(f)
	w.record("pack %s on %s via %s", req.Archive, node, podName)
	if err := w.fail(report.Image); err != nil {
		return agent.PackResult{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.archives, req.Archive)
	ref := req.Image + "@sha256:abc"
	w.images[ref] = true
	return agent.PackResult{Image: ref, ArchiveBytes: 2048}, nil
}

func (f *fakePacker) Remove(_ context.Context, podName, node string, archives []string) error {
	w := (*world)(f)
	w.record("remove %v on %s", archives, node)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range archives {
		delete(w.archives, a)
	}
	return nil
}

type fakeBroker world

func (f *fakeBroker) CheckExchange(string) error { return nil }
func (f *fakeBroker) Close() error               { return nil }

func (f *fakeBroker) BindReplayQueue(_, queue string) error {
	w := (*world)(f)
	w.record("bind %s", queue)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queues[queue] = true
	return nil
}

func (f *fakeBroker) PublishMarker(_ context.Context, _, id string) error {
	w := (*world)(f)
	w.record("marker %s", id)
	if err := w.fail(report.Prepare); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.apps["consumer"].Barrier = id
	return nil
}

func (f *fakeBroker) QueueDepth(queue string) (int, error) {
	w := (*world)(f)
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.queues[queue] {
		return 0, fmt.Errorf("queue %q: %w", queue, &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND"})
	}
	return 7, nil
}

func (f *fakeBroker) DeleteQueue(queue string) error {
	w := (*world)(f)
	w.record("delete queue %s", queue)
	if err := w.fail(report.Cleanup); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.queues, queue)
	return nil
}

type fakeApp world

func (f *fakeApp) State(_ context.Context, t appctl.Target) (ms2m.State, error) {
	w := (*world)(f)
	w.mu.Lock()
	defer w.mu.Unlock()
	st, ok := w.apps[t.Pod]
	if !ok {
		return ms2m.State{}, fmt.Errorf("%s unreachable", t)
	}
	return *st, nil
}

func (f *fakeApp) Control(_ context.Context, t appctl.Target, msg ms2m.Control) (ms2m.State, error) {
	w := (*world)(f)
	w.record("control %s %s", t.Pod, msg.Type)
	if msg.Type == ms2m.Stop && w.failAt == report.Switchover {
		return ms2m.State{}, errInjected
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	st, ok := w.apps[t.Pod]
	if !ok {
		return ms2m.State{}, fmt.Errorf("%s unreachable", t)
	}
	switch msg.Type {
	case ms2m.Prepare:
		st.PendingRestore = true
	case ms2m.Checkpointed:
		st.PendingRestore = false
		st.LastSeq += 10 // the source goes on after the checkpoint
	case ms2m.Stop:
		st.Mode = ms2m.ModeHold
	case ms2m.Resume, ms2m.EndReplay:
		st.Mode, st.PendingRestore = ms2m.ModePrimary, false
	case ms2m.StartReplay:
		st.Mode, st.PendingRestore = ms2m.ModeReplay, false
		if w.failAt != report.Replay {
			st.LastSeq = w.apps["consumer"].LastSeq // caught up at once
		}
	}
	return *st, nil
}

func (f *fakeApp) AppliedAfter(_ context.Context, t appctl.Target, seq uint64) (ms2m.Applied, error) {
	w := (*world)(f)
	w.mu.Lock()
	defer w.mu.Unlock()
	last := w.apps["consumer"].LastAppliedAt
	return ms2m.Applied{Seq: seq + 1, Sent: last.Add(-time.Second), AppliedAt: last.Add(1500 * time.Millisecond)}, nil
}

type fakeRegistry world

func (f *fakeRegistry) CheckPush(context.Context, string) error {
	return (*world)(f).fail(report.Preflight)
}

func (f *fakeRegistry) Delete(_ context.Context, ref string) error {
	w := (*world)(f)
	w.record("delete image %s", ref)
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.images, ref)
	return nil
}

type fakeStore world

func (f *fakeStore) Save(_ context.Context, r *report.Record) error {
	w := (*world)(f)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.saved = append(w.saved, r)
	return nil
}
