// Package migratetest is a fake world for testing code that runs migrations:
// a fake clientset whose "kubelet" starts pods and restores the application,
// and a fake kubelet health check, agents (which checkpoint, pack, send and
// stage), broker, registry, application and record store, each able to fail
// on demand and recording what was done.
package migratetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
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
	// ControllerDown: no agents' controller runs (none holds its lease).
	ControllerDown bool
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
	// PagesLost, if set, breaks every lazy restore's page stream before
	// its last page.
	PagesLost bool
	// PortHeldByTheGone is how many receivers in a row end because their
	// port is held by a process no pod shows any more (one that was ending).
	PortHeldByTheGone int

	// VolumeBytes is what the source's emptyDir volumes hold, as its agent
	// measures them.
	VolumeBytes int64

	// AfterCheckpoint, if set, runs once the archive exists, before the
	// kubelet's answer: a test's process can die there.
	AfterCheckpoint func()

	// NoContract: the applications do not follow the MS2M contract; they
	// have no control endpoint, and a call to one fails.
	NoContract bool

	// IsolationIgnored makes the agents answer a cut off the network
	// without making it, so that a test sees what a missing cut costs.
	IsolationIgnored bool

	Mu       sync.Mutex
	Calls    []string
	Queues   map[string]bool
	Apps     map[string]*protocol.State
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
	Expected map[string]bool
	// Isolated are the pods cut off the network (agent.Launcher.Fence),
	// by name: their clients reach them no more, so they serve nothing.
	Isolated  map[string]bool
	snapshot  protocol.State // the application's memory at the checkpoint
	published uint64         // the last sequence published, which replay reaches
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
	// frozen are the pods a lazy checkpoint left frozen until their page
	// session ends (their agent reports it): they answer nothing.
	frozen map[string]bool
	// pageSessions are the pods a lazy checkpoint was taken of.
	pageSessions map[string]bool
	// replaying are the copies that replay whatever arrives.
	replaying map[string]bool
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
// protocol.ControlSecret in namespace default): they refuse calls without it.
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
		Apps:     map[string]*protocol.State{"consumer": {Contract: protocol.ContractVersion, Mode: protocol.ModePrimary, LastSeq: 100, Process: "p1", LastAppliedAt: time.Now()}},
		Archives: map[string]bool{}, Images: map[string]bool{}, Staged: map[string]bool{}, BoundTo: map[string]types.UID{}, Expected: map[string]bool{}, Isolated: map[string]bool{}, reconnecting: map[string]bool{}, frozen: map[string]bool{}, pageSessions: map[string]bool{}, replaying: map[string]bool{}, Unanswered: map[string]int{}, Stalled: map[string]int{},
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
		ObjectMeta: metav1.ObjectMeta{Name: protocol.ControlSecret, Namespace: "default"},
		Data:       map[string][]byte{protocol.TokenKey: []byte(ControlToken)},
	}, metav1.CreateOptions{})
	w.versionObjects()
	w.agentsController()
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

// Deps returns the engine dependencies backed by w.
func (w *World) Deps() migrate.Deps {
	return migrate.Deps{
		Client: w.engine, Kubelet: (*fakeKubelet)(w), Packer: &fakePacker{w: w},
		DialBroker: func(context.Context, string) (migrate.Broker, error) { return (*fakeBroker)(w), nil },
		App:        (*fakeApp)(w), Registry: (*fakeRegistry)(w), Records: report.Store{Client: w.engine},
		JournalKey: migrate.JournalKeyIn(w.engine, agent.DefaultNamespace),
	}
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
		if !probe && !strings.HasPrefix(c, "prepull ") && !strings.HasPrefix(c, "ask the runtime ") && !strings.HasPrefix(c, "warm agent ") && !strings.HasPrefix(c, "end agent ") && !strings.HasPrefix(c, "measure ") && c != "release agents" {
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

// agentsController answers for the agents' controller's lease as a
// running controller renews it, unless ControllerDown.
func (w *World) agentsController() {
	w.Client.PrependReactor("get", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		get := a.(k8stesting.GetAction)
		if get.GetName() != agent.ControllerName {
			return false, nil, nil
		}
		w.Mu.Lock()
		defer w.Mu.Unlock()
		if w.ControllerDown {
			return true, nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), agent.ControllerName)
		}
		return true, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: agent.ControllerName, Namespace: get.GetNamespace()},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("controller-0"), LeaseDurationSeconds: ptr.To[int32](15),
				RenewTime: &metav1.MicroTime{Time: time.Now()}},
		}, nil
	})
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
