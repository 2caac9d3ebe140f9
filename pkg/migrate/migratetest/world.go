// Package migratetest is a fake world for testing code that runs migrations:
// a fake clientset whose "kubelet" starts pods and restores the application,
// and fake kubelet checkpoint API, agent, broker, registry, application and
// record store, each able to fail on demand and recording what was done.
package migratetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// ErrInjected is what a fake returns when told to fail.
var ErrInjected = errors.New("injected failure")

// World is a fake cluster, broker, registry and application whose parts can
// be told to fail, recording what was done to them.
type World struct {
	T      *testing.T
	Client *fake.Clientset
	// engine is the client the engine gets (Deps): the same cluster, with
	// every call it makes recorded in apiCalls.
	engine      *fake.Clientset
	engineCalls func() []APICall
	// FailAt makes the fake that phase uses fail: every time, or only the
	// FailNth time (from 1) when set, for phases that run more than once.
	FailAt  report.PhaseName
	FailNth int
	failed  map[report.PhaseName]int

	// RegistryDown makes the registry refuse deletes (it went away).
	RegistryDown bool

	// RuntimeConfig is what a node's runtime reports as its configuration
	// (a verbose CRI status's "config"), by node; absent: it reports none.
	RuntimeConfig map[string]string

	// KubeletDown names the nodes whose kubelet is gone (set under Mu): it
	// answers no health check, starts no pod and confirms no graceful
	// delete; the node's runtime still answers its agent.
	KubeletDown map[string]bool

	// AppliedDelay, by pod, is how long after its sending that pod applied
	// the first message after any position (a gap of exactly that); pods
	// not named answer as one instance that applied it 1.5 s after the
	// last application.
	AppliedDelay map[string]time.Duration

	// InitWaiting, if set, is why a pod's init containers wait to start
	// (e.g. ErrImagePull): they never end.
	InitWaiting string

	// DieAfterStaging, if set, ends the migration's goroutine (as a
	// SIGKILL ends the process) as soon as an agent has staged a
	// checkpoint for it: before the migration could journal it. Once.
	DieAfterStaging bool

	// VolumeBytes is what the source's emptyDir volumes hold, as its agent
	// measures them.
	VolumeBytes int64

	// AfterCheckpoint, if set, runs once the archive exists, before the
	// kubelet's answer: a test's process can die there.
	AfterCheckpoint func()

	Mu       sync.Mutex
	Calls    []string
	Queues   map[string]bool
	Apps     map[string]*ms2m.State
	Archives map[string]bool
	Images   map[string]bool
	// Staged are the checkpoints staged for the kubectl-migrate runtime
	// (agent.StagedPath), until a pod under its RuntimeClass restores one.
	Staged map[string]bool
	// BoundTo is the pod UID each staged checkpoint is for; none while
	// it was staged before its pod existed and not yet bound.
	BoundTo map[string]types.UID
	// Expected are the marks of checkpoints on their way (ExpectedPath):
	// a pod under the runtime waits for its checkpoint while marked.
	Expected  map[string]bool
	snapshot  ms2m.State // the application's memory at the checkpoint
	published uint64     // the last sequence published, which replay reaches
	// Unanswered makes a pod's next state reads fail, as a restarting
	// process's endpoint does (set it under Mu).
	Unanswered map[string]int
	// Stalled makes a pod's next state reads hang until their caller gives
	// up, as a connection opened while CRIU restores the pod does (set it
	// under Mu); StallEnds says why each ended, in order.
	Stalled   map[string]int
	StallEnds []error
	// reconnecting restored apps switch to hold after their first answer.
	reconnecting map[string]bool
	// deletedSets are the StatefulSets whose deletion has begun.
	deletedSets map[types.UID]bool

	// acked is, by process identity (one lineage of state), the last
	// sequence acknowledged from the primary queue by any of its copies;
	// restored lists the pods running a copy restored from a checkpoint.
	acked    map[string]uint64
	restored map[string]bool
	// violations are the breaches of conservation the fakes saw: a copy
	// that went on from a state missing messages another copy had
	// acknowledged, or two copies consuming the primary queue at once.
	violations []string
}

// Node returns a Ready node with the given runtime.
func Node(name, runtimeVersion string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			NodeInfo:   corev1.NodeSystemInfo{ContainerRuntimeVersion: runtimeVersion},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2." + strconv.Itoa(int(name[len(name)-1]))}},
		},
	}
}

// SourcePod is the pod a World migrates.
func SourcePod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "consumer", Namespace: "default", UID: "source-uid", Labels: map[string]string{"app": "consumer"}},
		Spec: corev1.PodSpec{
			NodeName:   "node-a",
			Containers: []corev1.Container{{Name: "app", Image: "registry/consumer:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
	}
}

// ControlToken is the token of the world's applications (its Secret
// ms2m.ControlSecret in namespace default): they refuse calls without it.
const ControlToken = "world-token"

// NewWorld returns a world with nodes node-a and node-b (CRI-O) and a running
// bare pod default/consumer on node-a whose application is at sequence 100.
// With objects, those are the cluster instead.
func NewWorld(t *testing.T, objects ...runtime.Object) *World {
	if len(objects) == 0 {
		objects = []runtime.Object{Node("node-a", "cri-o://1.34.0"), Node("node-b", "cri-o://1.34.0"), SourcePod()}
	}
	w := &World{
		T: t, Client: fake.NewClientset(objects...),
		Queues:   map[string]bool{"work": true},
		Apps:     map[string]*ms2m.State{"consumer": {Contract: ms2m.ContractVersion, Mode: ms2m.ModePrimary, LastSeq: 100, Process: "p1", LastAppliedAt: time.Now()}},
		Archives: map[string]bool{}, Images: map[string]bool{}, Staged: map[string]bool{}, BoundTo: map[string]types.UID{}, Expected: map[string]bool{}, reconnecting: map[string]bool{}, Unanswered: map[string]int{}, Stalled: map[string]int{},
		failed: map[report.PhaseName]int{}, published: 100, deletedSets: map[types.UID]bool{},
		acked: map[string]uint64{}, restored: map[string]bool{},
	}
	created := 0
	w.Client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod); pod.UID == "" {
			created++ // the API server gives every new object its own UID
			pod.UID = types.UID(fmt.Sprintf("pod-uid-%d", created))
		}
		return false, nil, nil
	})
	w.Client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authzv1.SelfSubjectAccessReview)
		r.Status.Allowed = true
		return true, r, nil
	})
	for _, st := range w.Apps {
		w.acked[st.Process] = st.LastSeq
	}
	// The applications' control token, which every call to them must carry.
	_, _ = w.Client.CoreV1().Secrets("default").Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: ms2m.ControlSecret, Namespace: "default"},
		Data:       map[string][]byte{ms2m.TokenKey: []byte(ControlToken)},
	}, metav1.CreateOptions{})
	w.versionObjects()
	w.recordEngineCalls()
	w.podsOnDeadKubelets()
	w.startKubelet()
	return w
}

func (w *World) record(format string, args ...any) {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.Calls = append(w.Calls, fmt.Sprintf(format, args...))
}

func (w *World) fail(p report.PhaseName) error {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if w.FailAt != p {
		return nil
	}
	w.failed[p]++
	if w.FailNth == 0 || w.failed[p] == w.FailNth {
		return ErrInjected
	}
	return nil
}

// FailOn sets FailAt and FailNth while the fakes' goroutines may be acting.
func (w *World) FailOn(p report.PhaseName, nth int) {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.FailAt, w.FailNth = p, nth
}

// startKubelet runs pods created on a node: the restored pod comes up with
// the source's application state, as a restore would bring it.
func (w *World) startKubelet() {
	ctx, cancel := context.WithCancel(context.Background())
	w.T.Cleanup(cancel)
	watcher, err := w.Client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	go func() {
		for ev := range watcher.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if ev.Type != watch.Added || !ok || pod.Status.Phase != "" {
				continue
			}
			w.Mu.Lock()
			down := w.KubeletDown[pod.Spec.NodeName]
			w.Mu.Unlock()
			if down {
				continue // it stays pending: no kubelet runs it
			}
			underRuntime := pod.Spec.RuntimeClassName != nil && *pod.Spec.RuntimeClassName == ociruntime.HandlerName
			id := ociruntime.Identity{Namespace: pod.Namespace, Pod: pod.Name, Container: pod.Spec.Containers[0].Name}
			handle := agent.StagedPath(id)
			w.Mu.Lock()
			awaited := w.Expected[agent.ExpectedPath(id)] || w.Staged[handle] && w.BoundTo[handle] == ""
			w.Mu.Unlock()
			if underRuntime && awaited {
				w.reportAddress(ctx, pod)
				// The runtime holds the create until a checkpoint is
				// staged for this pod's UID, or fails it when the mark
				// and the unbound checkpoint go.
				go func() {
					for {
						w.Mu.Lock()
						staged := w.Staged[handle] && w.BoundTo[handle] == pod.UID
						awaited := w.Expected[agent.ExpectedPath(id)] || w.Staged[handle] && w.BoundTo[handle] == ""
						if staged {
							delete(w.Expected, agent.ExpectedPath(id))
						}
						w.Mu.Unlock()
						if staged {
							w.run(ctx, pod, id, underRuntime)
							return
						}
						if !awaited || ctx.Err() != nil {
							return
						}
						time.Sleep(5 * time.Millisecond)
					}
				}()
				continue
			}
			w.run(ctx, pod, id, underRuntime)
		}
	}()
}

// reportAddress reports pod's address once its init containers ended, as
// the kubelet does before it creates the containers the runtime holds.
func (w *World) reportAddress(ctx context.Context, pod *corev1.Pod) {
	if len(pod.Spec.InitContainers) == 0 {
		return
	}
	pod.Status.PodIP = "10.0.0.2"
	state := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}
	if w.InitWaiting != "" {
		state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: w.InitWaiting}}
	}
	for _, c := range pod.Spec.InitContainers {
		pod.Status.InitContainerStatuses = append(pod.Status.InitContainerStatuses, corev1.ContainerStatus{Name: c.Name, State: state})
	}
	if updated, err := w.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err == nil {
		*pod = *updated
	}
}

// run starts pod as its node's runtime would: restored from the checkpoint,
// or afresh.
func (w *World) run(ctx context.Context, pod *corev1.Pod, id ociruntime.Identity, underRuntime bool) {
	state := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	staged := agent.StagedPath(id)
	volumes := agent.StagedPath(ociruntime.Identity{Namespace: id.Namespace, Pod: id.Pod, Container: agent.VolumesKey})
	w.Mu.Lock()
	hasCheckpoint := w.Staged[staged] && w.BoundTo[staged] == pod.UID
	if hasCheckpoint || !underRuntime {
		delete(w.Staged, staged) // the runtime claims it, restored or not
		delete(w.BoundTo, staged)
	}
	// The create that restores fills the emptyDir volumes staged by then.
	fills := underRuntime && hasCheckpoint && w.Staged[volumes] && w.BoundTo[volumes] == pod.UID
	if fills {
		delete(w.Staged, volumes)
		delete(w.BoundTo, volumes)
	}
	w.Mu.Unlock()
	if fills {
		w.record("runtime fills the emptyDir volumes of %s", id.Pod)
	}
	switch {
	case pod.Annotations[freshAnnotation] != "" || underRuntime && !hasCheckpoint:
		w.Mu.Lock()
		w.Apps[pod.Name] = &ms2m.State{Contract: ms2m.ContractVersion, Mode: ms2m.ModePrimary, Process: FreshProcess}
		delete(w.restored, pod.Name)
		w.Mu.Unlock()
	case w.fail(report.Restore) != nil:
		state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: "criu failed"}}
	default:
		w.Mu.Lock()
		// Like a real restore: the copy answers first in the mode it
		// was checkpointed in, and holds once it has noticed its dead
		// broker connection (on its first answer here).
		restored := w.snapshot
		w.Apps[pod.Name] = &restored
		w.restored[pod.Name] = true
		if restored.PendingRestore {
			w.reconnecting[pod.Name] = true
		}
		w.Mu.Unlock()
	}
	pod.Status.Phase = corev1.PodRunning
	if state.Running != nil {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	}
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, State: state})
	}
	_, _ = w.Client.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
}

// Deps returns the engine dependencies backed by w.
func (w *World) Deps() migrate.Deps {
	return migrate.Deps{
		Client: w.engine, Kubelet: (*fakeKubelet)(w), Packer: &fakePacker{w: w},
		DialBroker: func(context.Context, string) (migrate.Broker, error) { return (*fakeBroker)(w), nil },
		App:        (*fakeApp)(w), Registry: (*fakeRegistry)(w), Records: report.Store{Client: w.engine},
		JournalKey: migrate.JournalKeyIn(w.engine, agent.DefaultNamespace),
	}
}

// APICall is one request made of the API server.
type APICall struct {
	Group, Verb, Resource, Subresource, Namespace string
}

// Recording returns a clientset that hands every request to target and
// records it, and a function that returns the requests recorded so far.
func Recording(target *fake.Clientset) (*fake.Clientset, func() []APICall) {
	var mu sync.Mutex
	var calls []APICall
	recording := &fake.Clientset{}
	record := func(a k8stesting.Action) {
		mu.Lock()
		defer mu.Unlock()
		r := a.GetResource()
		calls = append(calls, APICall{Group: r.Group, Verb: a.GetVerb(), Resource: r.Resource, Subresource: a.GetSubresource(), Namespace: a.GetNamespace()})
	}
	recording.AddReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		record(a)
		obj, err := target.Invokes(a, nil)
		return true, obj, err
	})
	recording.AddWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		record(a)
		watcher, err := target.InvokesWatch(a)
		return true, watcher, err
	})
	return recording, func() []APICall {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
}

// recordEngineCalls makes the engine's client, which records every
// request (the world's own kubelets and controllers use the world's
// client, unrecorded).
func (w *World) recordEngineCalls() {
	w.engine, w.engineCalls = Recording(w.Client)
}

// APICalls returns the requests the engine made so far.
func (w *World) APICalls() []APICall { return w.engineCalls() }

type fakeKubelet World

func (f *fakeKubelet) Checkpoint(_ context.Context, node, ns, pod, ctr string, _ time.Duration) (string, error) {
	w := (*World)(f)
	w.record("checkpoint %s/%s/%s on %s", ns, pod, ctr, node)
	if err := w.fail(report.Checkpoint); err != nil {
		return "", err
	}
	archive := agent.CheckpointDir + "/checkpoint-" + pod + "_" + ns + "-" + ctr + "-2026-12-01T09:00:00Z.tar"
	w.Mu.Lock()
	w.Archives[archive] = true
	w.snapshot = *w.Apps[pod]
	after := w.AfterCheckpoint
	w.Mu.Unlock()
	if after != nil {
		after()
	}
	return archive, nil
}

// Healthy answers as the API server does for a kubelet it cannot reach.
func (f *fakeKubelet) Healthy(_ context.Context, node string) error {
	w := (*World)(f)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if w.KubeletDown[node] {
		return apierrors.NewServiceUnavailable("error trying to reach service: dial tcp " + node + ":10250: connect: connection refused")
	}
	return nil
}

// fakePacker is one process's agents: the warm ones it started (which a
// new process, say a recovery, does not have) and the World's pods.
type fakePacker struct {
	w    *World
	mu   sync.Mutex
	warm map[string]bool // by node
}

// StopPod ends the application of the pod with uid, as stopping its
// sandbox through the runtime would.
func (f *fakePacker) StopPod(ctx context.Context, node, uid string) (agent.StopPodResult, error) {
	w := f.w
	pods, err := w.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return agent.StopPodResult{}, err
	}
	var res agent.StopPodResult
	for _, p := range pods.Items {
		if p.UID != types.UID(uid) || p.Spec.NodeName != node {
			continue
		}
		w.record("stop pod %s on %s through the runtime", p.Name, node)
		w.Mu.Lock()
		if _, ran := w.Apps[p.Name]; ran {
			delete(w.Apps, p.Name)
			res.Sandboxes = append(res.Sandboxes, "sandbox-"+p.Name)
		}
		w.Mu.Unlock()
	}
	return res, nil
}

func (f *fakePacker) Pack(_ context.Context, podName, node string, req agent.PackRequest) (agent.PackResult, error) {
	w := f.w
	w.record("pack %s on %s via %s", req.Archive, node, podName)
	if req.SendTo != "" && !f.serving(node) {
		return agent.PackResult{}, fmt.Errorf("a transfer without a registry needs the warm agent on %s, which is gone; run the migration again", node)
	}
	if req.SendTo != "" {
		if req.CertSHA256 != fakeDirectCert {
			return agent.PackResult{}, fmt.Errorf("send to %s pinning %q, not the target agent's certificate", req.SendTo, req.CertSHA256)
		}
		w.record("send to %s as %s:%s", req.SendTo, req.Repository, req.Tag)
		req.Image = agent.DirectRegistry() + "/" + req.Repository + ":" + req.Tag
		if req.StageAs != nil {
			if err := w.fail(report.Image); err != nil {
				return agent.PackResult{}, err
			}
			staged := agent.StagedPath(*req.StageAs)
			w.record("stage %s", staged)
			w.Mu.Lock()
			defer w.Mu.Unlock()
			if !req.KeepArchive {
				delete(w.Archives, req.Archive)
			}
			w.Staged[staged] = true
			w.BoundTo[staged] = types.UID(req.StageAs.UID)
			if w.DieAfterStaging {
				w.DieAfterStaging = false
				goruntime.Goexit()
			}
			return agent.PackResult{Staged: staged, ArchiveBytes: 2048}, nil
		}
	}
	if err := w.fail(report.Image); err != nil {
		return agent.PackResult{}, err
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if !req.KeepArchive {
		delete(w.Archives, req.Archive)
	}
	ref := req.Image + "@sha256:abc"
	w.Images[ref] = true
	return agent.PackResult{Image: ref, ArchiveBytes: 2048}, nil
}

// SnapshotVolumes measures the pod's emptyDir volumes as VolumeBytes, and
// with an archive leaves one, as the agent does.
func (f *fakePacker) SnapshotVolumes(_ context.Context, node string, req agent.SnapshotRequest) (agent.SnapshotResult, error) {
	w := f.w
	if req.Archive == "" {
		w.record("measure emptyDir %v of %s on %s", req.Volumes, req.PodUID, node)
	} else {
		w.record("snapshot emptyDir %v of %s on %s to %s", req.Volumes, req.PodUID, node, req.Archive)
	}
	if !f.serving(node) {
		return agent.SnapshotResult{}, fmt.Errorf("snapshotting emptyDir volumes needs the warm agent on %s, which is gone; run the migration again", node)
	}
	if req.MaxBytes > 0 && w.VolumeBytes > req.MaxBytes {
		return agent.SnapshotResult{}, fmt.Errorf("%w: emptyDir %s holds more than %d bytes", agent.ErrTooLarge, req.Volumes[0], req.MaxBytes)
	}
	if req.Archive != "" {
		w.Mu.Lock()
		w.Archives[req.Archive] = true
		w.Mu.Unlock()
	}
	return agent.SnapshotResult{Archive: req.Archive, Bytes: w.VolumeBytes, Files: 1}, nil
}

func (f *fakePacker) Remove(_ context.Context, podName, node string, archives []string) error {
	w := f.w
	w.record("remove %v on %s", archives, node)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	for _, a := range archives {
		delete(w.Staged, a)
		delete(w.BoundTo, a)
		delete(w.Expected, a)
		for have := range w.Archives {
			if ok, _ := path.Match(a, have); ok {
				delete(w.Archives, have)
			}
		}
	}
	return nil
}

func (f *fakePacker) Expect(_ context.Context, node string, ids []ociruntime.Identity) error {
	w := f.w
	w.Mu.Lock()
	defer w.Mu.Unlock()
	for _, id := range ids {
		w.Calls = append(w.Calls, fmt.Sprintf("expect %s on %s", agent.ExpectedPath(id), node))
		w.Expected[agent.ExpectedPath(id)] = true
	}
	return nil
}

// Bind gives the checkpoints staged unbound for ids' names to the pod of
// their UID, as the agent does: one bound to another pod's stays its.
func (f *fakePacker) Bind(_ context.Context, node string, ids []ociruntime.Identity) error {
	w := f.w
	w.Mu.Lock()
	defer w.Mu.Unlock()
	for _, id := range ids {
		handle := agent.StagedPath(id)
		w.Calls = append(w.Calls, fmt.Sprintf("bind %s to %s on %s", handle, id.UID, node))
		switch bound := w.BoundTo[handle]; {
		case !w.Staged[handle]:
			return fmt.Errorf("bind the checkpoint staged for %s: none is staged", handle)
		case bound != "" && bound != types.UID(id.UID):
			return fmt.Errorf("bind the checkpoint staged for %s: bound to pod %s", handle, bound)
		}
		w.BoundTo[handle] = types.UID(id.UID)
	}
	return nil
}

// agentLabels are the labels of the agent pods the fake starts.
var agentLabels = map[string]string{"app.kubernetes.io/name": "kubectl-migrate-agent"}

// Warm starts a receiving agent (one with a DirectToken) as a pod holding
// node's receive port, which the kubelet refuses while another pod holds it,
// and which stays until Release: a process that dies leaves it running.
func (f *fakePacker) Warm(ctx context.Context, podName, node string, opts agent.WarmOptions) error {
	w := f.w
	w.record("warm agent %s on %s (direct %t)", podName, node, opts.DirectToken != "")
	if opts.DirectToken == "" {
		f.serve(node)
		return nil
	}
	pods, err := w.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && agent.HoldsReceivePort(&p) {
			return fmt.Errorf("the agent on %s ended: no termination message (pod %s holds the receive port)", node, p.Name)
		}
	}
	// Its migration's ID is the first word of its stage tag.
	id, _, _ := strings.Cut(strings.TrimPrefix(podName, "kubectl-migrate-agent-"), "-")
	labels := maps.Clone(agentLabels)
	labels[migrate.MigrationLabel] = id
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: "default", Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: true, Containers: []corev1.Container{{
			Name: "agent", Ports: []corev1.ContainerPort{{ContainerPort: agent.DirectReceivePort, HostPort: agent.DirectReceivePort}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if _, err = w.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	f.serve(node)
	return nil
}

// serve keeps node's warm agent for this process's later calls.
func (f *fakePacker) serve(node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.warm == nil {
		f.warm = map[string]bool{}
	}
	f.warm[node] = true
}

func (f *fakePacker) serving(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.warm[node]
}

// Release ends the agent pods, as the real launcher does, so it fails when
// the API server cannot be reached.
func (f *fakePacker) Release(ctx context.Context) error {
	w := f.w
	w.record("release agents")
	f.mu.Lock()
	f.warm = nil
	f.mu.Unlock()
	pods, err := w.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(agentLabels).String()})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if err := w.Client.CoreV1().Pods("default").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// fakeDirectCert is the fingerprint of every fake direct-transfer agent's
// certificate.
const fakeDirectCert = "0123abcd"

func (f *fakePacker) DirectCert(_ context.Context, node string) (string, error) {
	f.w.record("ask the direct agent on %s for its certificate", node)
	return fakeDirectCert, nil
}

func (f *fakePacker) Runtime(_ context.Context, node string) (agent.RuntimeInfo, error) {
	w := f.w
	w.record("ask the runtime on %s", node)
	n, err := w.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		return agent.RuntimeInfo{}, err
	}
	name, version, _ := strings.Cut(n.Status.NodeInfo.ContainerRuntimeVersion, "://")
	return agent.RuntimeInfo{Name: name, Version: version, Config: w.RuntimeConfig[node]}, nil
}

func (f *fakePacker) Prepull(_ context.Context, podName, node string, images []string) error {
	f.w.record("prepull %v on %s", images, node)
	for _, img := range images {
		if strings.HasSuffix(img, "@sha256:abc") { // what Pack pushes
			return fmt.Errorf("agent container cannot start: %s is a checkpoint, not a base image", img)
		}
	}
	return f.w.fail(report.Setup)
}

type fakeBroker World

func (f *fakeBroker) CheckExchange(context.Context, string) error { return nil }
func (f *fakeBroker) Close() error                                { return nil }

func (f *fakeBroker) BindReplayQueue(_ context.Context, _, queue string) error {
	w := (*World)(f)
	w.record("bind %s", queue)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.Queues[queue] = true
	return nil
}

func (f *fakeBroker) BindProbeQueue(_ context.Context, _, queue string, _ time.Duration) error {
	w := (*World)(f)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.Queues[queue] = true
	return nil
}

func (f *fakeBroker) DeclareQueue(_ context.Context, queue string) error {
	w := (*World)(f)
	w.record("declare %s", queue)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.Queues[queue] = true
	return nil
}

func (f *fakeBroker) PublishMarker(_ context.Context, _, id string) error {
	w := (*World)(f)
	w.record("marker %s", id)
	if err := w.fail(report.Prepare); err != nil {
		return err
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	for _, st := range w.Apps {
		if st.Mode == ms2m.ModePrimary {
			st.Barrier = id
		}
	}
	return nil
}

func (f *fakeBroker) QueueDepth(_ context.Context, queue string) (int, error) {
	w := (*World)(f)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if !w.Queues[queue] {
		return 0, fmt.Errorf("queue %q: %w", queue, &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND"})
	}
	return 7, nil
}

func (f *fakeBroker) DeleteQueue(_ context.Context, queue string) error {
	w := (*World)(f)
	w.record("delete queue %s", queue)
	if err := w.fail(report.Cleanup); err != nil {
		return err
	}
	var held []string
	if strings.HasSuffix(queue, ".ms2m-migration") {
		held = w.runningPods(func(st *ms2m.State, restored bool) bool { return restored && st.Mode == ms2m.ModeHold })
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	delete(w.Queues, queue)
	// As the real consumer does: a restored copy still running when its
	// migration's queue goes takes itself for a restart and serves.
	for _, pod := range held {
		if st := w.Apps[pod]; st != nil && st.Mode == ms2m.ModeHold {
			w.serve(pod, st)
		}
	}
	return nil
}

// runningPods lists the pods that exist (not being deleted) and whose
// application matches.
func (w *World) runningPods(match func(st *ms2m.State, restored bool) bool) []string {
	pods, err := w.Client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), "default")
	if err != nil {
		return nil
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	var names []string
	for _, p := range pods.(*corev1.PodList).Items {
		if st := w.Apps[p.Name]; st != nil && p.DeletionTimestamp == nil && match(st, w.restored[p.Name]) {
			names = append(names, p.Name)
		}
	}
	return names
}

// serve puts pod's application on the primary queue (w.Mu held). The
// producer goes on meanwhile, and the copy consumes what arrives: a copy
// whose state lacks what another copy of it acknowledged has lost those
// messages, as the real consumer's "sequence gap" shows.
func (w *World) serve(pod string, st *ms2m.State) {
	if acked := w.acked[st.Process]; st.LastSeq < acked {
		w.violations = append(w.violations, fmt.Sprintf("%s resumed the primary queue at %d, but copies of its state had acknowledged up to %d: %d messages lost", pod, st.LastSeq, acked, acked-st.LastSeq))
	}
	st.Mode, st.PendingRestore = ms2m.ModePrimary, false
	w.published += 10
	st.LastSeq = w.published
	w.acked[st.Process] = st.LastSeq
}

// Conservation returns the breaches of conservation the world saw, and
// those it sees now: every lineage of state must be served by exactly one
// running pod, and that pod's state must hold every message any copy of it
// acknowledged.
func (w *World) Conservation() error {
	serving := map[string][]string{}
	for _, pod := range w.runningPods(func(st *ms2m.State, _ bool) bool { return st.Mode != ms2m.ModeHold }) {
		w.Mu.Lock()
		serving[w.Apps[pod].Process] = append(serving[w.Apps[pod].Process], pod)
		w.Mu.Unlock()
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	problems := slices.Clone(w.violations)
	for process, acked := range w.acked {
		pods := serving[process]
		switch {
		case len(pods) != 1:
			problems = append(problems, fmt.Sprintf("state %s is served by %d pods %v, want 1", process, len(pods), pods))
		case w.Apps[pods[0]].LastSeq < acked:
			problems = append(problems, fmt.Sprintf("%s serves state %s at %d, but %d was acknowledged", pods[0], process, w.Apps[pods[0]].LastSeq, acked))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("conservation broken: %s", strings.Join(problems, "; "))
	}
	return nil
}

type fakeApp World

// refused is how an application answers a call without its token.
func refused(t appctl.Target) error {
	if t.Token == ControlToken {
		return nil
	}
	return fmt.Errorf("%s: the application refused the call: missing or wrong %s header", t, ms2m.TokenHeader)
}

func (f *fakeApp) State(ctx context.Context, t appctl.Target) (ms2m.State, error) {
	if err := refused(t); err != nil {
		return ms2m.State{}, err
	}
	w := (*World)(f)
	w.Mu.Lock()
	if w.Stalled[t.Pod] > 0 {
		w.Stalled[t.Pod]--
		w.Mu.Unlock()
		<-ctx.Done()
		w.Mu.Lock()
		w.StallEnds = append(w.StallEnds, ctx.Err())
		w.Mu.Unlock()
		return ms2m.State{}, ctx.Err()
	}
	defer w.Mu.Unlock()
	st, ok := w.Apps[t.Pod]
	if w.Unanswered[t.Pod] > 0 {
		w.Unanswered[t.Pod]--
		ok = false
	}
	if !ok {
		return ms2m.State{}, fmt.Errorf("%s unreachable", t)
	}
	answer := *st
	if w.reconnecting[t.Pod] {
		delete(w.reconnecting, t.Pod)
		st.Mode = ms2m.ModeHold
	}
	return answer, nil
}

func (f *fakeApp) Control(_ context.Context, t appctl.Target, msg ms2m.Control) (ms2m.State, error) {
	if err := refused(t); err != nil {
		return ms2m.State{}, err
	}
	w := (*World)(f)
	w.record("control %s %s", t.Pod, msg.Type)
	if msg.Type == ms2m.Stop && w.fail(report.Switchover) != nil {
		return ms2m.State{}, ErrInjected
	}
	stuck := msg.Type == ms2m.StartReplay && w.fail(report.Replay) != nil
	w.Mu.Lock()
	defer w.Mu.Unlock()
	st, ok := w.Apps[t.Pod]
	if !ok {
		return ms2m.State{}, fmt.Errorf("%s unreachable", t)
	}
	switch msg.Type {
	case ms2m.Prepare:
		st.PendingRestore = true
	case ms2m.Checkpointed:
		st.PendingRestore = false
		st.LastSeq += 10 // the source goes on after the checkpoint, at 10/s
		st.LastAppliedAt = st.LastAppliedAt.Add(time.Second)
		w.published = max(w.published, st.LastSeq)
	case ms2m.Stop:
		st.Mode = ms2m.ModeHold
	case ms2m.Resume, ms2m.EndReplay:
		w.serve(t.Pod, st)
	case ms2m.StartReplay:
		st.Mode, st.PendingRestore = ms2m.ModeReplay, false
		if !stuck {
			st.LastSeq = w.published // caught up at once
		}
	}
	return *st, nil
}

func (f *fakeApp) AppliedAfter(_ context.Context, t appctl.Target, p ms2m.Position) (ms2m.Applied, error) {
	if err := refused(t); err != nil {
		return ms2m.Applied{}, err
	}
	w := (*World)(f)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	var last time.Time
	for _, st := range w.Apps {
		if st.LastAppliedAt.After(last) {
			last = st.LastAppliedAt
		}
	}
	if delay, ok := w.AppliedDelay[t.Pod]; ok {
		if _, running := w.Apps[t.Pod]; !running {
			return ms2m.Applied{}, fmt.Errorf("%s unreachable", t)
		}
		sent := last.Add(time.Second) // after the source stopped: the gap is the delay
		return ms2m.Applied{Producer: p.Producer, Seq: p.Seq + 1, Sent: sent, AppliedAt: sent.Add(delay)}, nil
	}
	return ms2m.Applied{Producer: p.Producer, Seq: p.Seq + 1, Sent: last.Add(-time.Second), AppliedAt: last.Add(1500 * time.Millisecond)}, nil
}

type fakeRegistry World

func (f *fakeRegistry) CheckPush(context.Context, string) error {
	return (*World)(f).fail(report.Preflight)
}

func (f *fakeRegistry) Delete(_ context.Context, ref string) error {
	w := (*World)(f)
	w.record("delete image %s", ref)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if w.RegistryDown {
		return errors.New("dial tcp registry:5000: connection refused")
	}
	delete(w.Images, ref)
	return nil
}

// Changes returns the calls that changed something: all but the agents'
// starts, pulls and ends, which a preflight may do.
func (w *World) Changes() []string {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	var changes []string
	for _, c := range w.Calls {
		// A dry run's probe queue counts arrivals for seconds and goes.
		probe := strings.Contains(c, ".ms2m-probe-")
		if !probe && !strings.HasPrefix(c, "prepull ") && !strings.HasPrefix(c, "ask the runtime ") && !strings.HasPrefix(c, "warm agent ") && !strings.HasPrefix(c, "measure ") && c != "release agents" {
			changes = append(changes, c)
		}
	}
	return changes
}

// Records returns the records saved in the fake cluster (as ConfigMaps, by
// the real store), newest first.
func (w *World) Records() []*report.Record {
	w.T.Helper()
	records, err := report.Store{Client: w.Client}.List(context.Background(), "default")
	if err != nil {
		w.T.Fatal(err)
	}
	return records
}

// Leases returns the names of the leases left in the fake cluster.
func (w *World) Leases() []string {
	w.T.Helper()
	list, err := w.Client.CoordinationV1().Leases("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	var names []string
	for _, l := range list.Items {
		names = append(names, l.Name)
	}
	return names
}

// versionObjects gives leases and ConfigMaps (records) the API server's
// optimistic concurrency, which the fake tracker lacks: an update naming a
// resourceVersion must name the stored one. A crashed migration's renewer (a goroutine that outlives the simulated
// crash, as a killed process's would not) then cannot renew a lease that
// changed since, just as on a real cluster.
func (w *World) versionObjects() {
	version := 0
	for _, resource := range []string{"leases", "configmaps"} {
		w.Client.PrependReactor("*", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetVerb() != "create" && a.GetVerb() != "update" {
				return false, nil, nil
			}
			obj := a.(k8stesting.CreateAction).GetObject().(metav1.Object)
			// As the API server: an update naming no version is unconditional.
			if a.GetVerb() == "update" && obj.GetResourceVersion() != "" {
				stored, err := w.Client.Tracker().Get(a.GetResource(), a.GetNamespace(), obj.GetName())
				if err == nil && stored.(metav1.Object).GetResourceVersion() != obj.GetResourceVersion() {
					return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), obj.GetName(), errors.New("the object has been modified"))
				}
			}
			version++ // the fake serialises every action, so no lock is needed
			obj.SetResourceVersion(strconv.Itoa(version))
			return false, nil, nil
		})
	}
}

// podsOnDeadKubelets gives pods UIDs (as the API server does) and keeps a
// pod whose node's kubelet is down terminating after a graceful delete,
// since only that kubelet would confirm it; a delete with no grace period
// removes it at once, as on a real cluster.
func (w *World) podsOnDeadKubelets() {
	uids := 0
	w.Client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod); pod.UID == "" {
			uids++ // the fake serialises every action
			pod.UID = types.UID(fmt.Sprintf("uid-%s-%d", pod.Name, uids))
		}
		return false, nil, nil
	})
	w.Client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		del := a.(k8stesting.DeleteAction)
		obj, err := w.Client.Tracker().Get(a.GetResource(), a.GetNamespace(), del.GetName())
		if err != nil {
			return false, nil, nil
		}
		pod := obj.(*corev1.Pod)
		w.Mu.Lock()
		down := w.KubeletDown[pod.Spec.NodeName]
		w.Mu.Unlock()
		if grace := del.GetDeleteOptions().GracePeriodSeconds; !down || grace != nil && *grace == 0 {
			return false, nil, nil
		}
		if pod.DeletionTimestamp == nil {
			pod.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			if err := w.Client.Tracker().Update(a.GetResource(), pod, a.GetNamespace()); err != nil {
				return true, nil, err
			}
		}
		return true, nil, nil
	})
}

// ExpireLeases makes every lease look given up, as the leases of a process
// that died; a renewer still running loses them (its next renewal
// conflicts).
func (w *World) ExpireLeases() {
	w.T.Helper()
	ctx := context.Background()
	list, err := w.Client.CoordinationV1().Leases("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		w.T.Fatal(err)
	}
	for _, l := range list.Items {
		// A renewer still running may have renewed the lease since the list.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			current, err := w.Client.CoordinationV1().Leases("default").Get(ctx, l.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			// As abandoned: recovery takes it at once (its holder's process
			// here is this test's, which lives on).
			current.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}
			current.Spec.LeaseDurationSeconds = ptr.To(int32(1))
			_, err = w.Client.CoordinationV1().Leases("default").Update(ctx, current, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			w.T.Fatal(err)
		}
	}
}
