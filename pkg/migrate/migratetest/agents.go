package migratetest

import (
	"context"
	"fmt"
	"maps"
	"path"
	goruntime "runtime"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// The world's node agents: pack, send, stage and snapshot as the real
// ones do, on the world's maps.

// fakePacker is one process's agents: the warm ones it started (which a
// new process, say a recovery, does not have) and the World's pods.
type fakePacker struct {
	w    *World
	mu   sync.Mutex
	warm map[string]bool // by node
	// started names the agents this process asked for: Release ends them
	// and those whose pods it finds, as the real launcher does, since
	// those who migrate may not list the agents' requests.
	started []string
	// runtime: the node's warm agent reaches its runtime (RuntimeSocket);
	// fences: it may cut pods off the network (WarmOptions.Fence).
	runtime map[string]bool
	fences  map[string]bool
}

// Fence cuts the pod with uid off the network, or lets it back on, as the
// node's agent does: only one started to fence can.
func (f *fakePacker) Fence(ctx context.Context, node, uid string, lift bool) (agent.FenceResult, error) {
	w := f.w
	f.mu.Lock()
	fences := f.fences[node]
	f.mu.Unlock()
	if !fences {
		return agent.FenceResult{}, fmt.Errorf("no agent on %s may fence pods", node)
	}
	if !lift {
		if err := w.fail(report.Stop); err != nil {
			return agent.FenceResult{}, err
		}
	}
	pods, err := w.podsOf(ctx, node, uid)
	if err != nil {
		return agent.FenceResult{}, err
	}
	var res agent.FenceResult
	for _, p := range pods {
		w.record("fence %s on %s (lift %t)", p.Name, node, lift)
		w.Mu.Lock()
		switch {
		case lift:
			delete(w.Isolated, p.Name)
		case !w.IsolationIgnored:
			w.Isolated[p.Name] = true
		}
		w.Mu.Unlock()
		res.Netns = append(res.Netns, "/run/netns/"+p.Name)
	}
	return res, nil
}

// podsOf lists the pods with uid on node: what a node's runtime finds by
// the kubelet's UID label.
func (w *World) podsOf(ctx context.Context, node, uid string) ([]corev1.Pod, error) {
	pods, err := w.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var found []corev1.Pod
	for _, p := range pods.Items {
		if p.UID == types.UID(uid) && p.Spec.NodeName == node {
			found = append(found, p)
		}
	}
	return found, nil
}

// StopPod ends the application of the pod with uid, as stopping its
// sandbox through the runtime would.
func (f *fakePacker) StopPod(ctx context.Context, node, uid string) (agent.StopPodResult, error) {
	w := f.w
	pods, err := w.podsOf(ctx, node, uid)
	if err != nil {
		return agent.StopPodResult{}, err
	}
	var res agent.StopPodResult
	for _, p := range pods {
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
			if req.Pages != nil {
				w.record("pages of %s/%s/%s (uid %s) follow", req.Pages.Namespace, req.Pages.Pod, req.Pages.Container, req.Pages.UID)
			}
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

// Warm asks for an agent with a request and starts its pod, which stays
// until Release: a process that dies leaves it running. A receiving agent
// (one with a DirectToken) holds node's receive port, which the kubelet
// refuses while another pod holds it.
func (f *fakePacker) Warm(ctx context.Context, podName, node string, opts agent.WarmOptions) error {
	w := f.w
	w.record("warm agent %s on %s (direct %t)", podName, node, opts.DirectToken != "")
	// Its migration's ID is the first word of its stage tag.
	id, _, _ := strings.Cut(strings.TrimPrefix(podName, "kubectl-migrate-agent-"), "-")
	labels := maps.Clone(agentLabels)
	labels[migrate.MigrationLabel] = id
	// Every agent is asked for with a request, as the real launcher does;
	// only deleting the request ends the agent for good.
	request := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: "default", Labels: labels}, Type: agent.RequestType}
	if _, err := w.Client.CoreV1().Secrets("default").Create(ctx, request, metav1.CreateOptions{}); err != nil {
		return err
	}
	f.mu.Lock()
	f.started = append(f.started, podName)
	f.mu.Unlock()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: "default", Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "agent"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if opts.DirectToken != "" {
		pods, err := w.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && agent.HoldsReceivePort(&p) {
				return fmt.Errorf("the agent on %s ended: no termination message (pod %s holds the receive port)", node, p.Name)
			}
		}
		w.Mu.Lock()
		gone := w.PortHeldByTheGone > 0
		if gone {
			w.PortHeldByTheGone--
		}
		w.Mu.Unlock()
		if gone {
			return fmt.Errorf("%w: the agent on %s ended: error: listen tcp :%d: bind: address already in use", agent.ErrPortInUse, node, agent.DirectReceivePort)
		}
		pod.Spec.HostNetwork = true
		pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: agent.DirectReceivePort, HostPort: agent.DirectReceivePort}}
	}
	if _, err := w.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	f.serve(node, opts.RuntimeSocket != "", opts.Fence)
	return nil
}

// serve keeps node's warm agent for this process's later calls.
func (f *fakePacker) serve(node string, runtime, fences bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.warm == nil {
		f.warm, f.runtime, f.fences = map[string]bool{}, map[string]bool{}, map[string]bool{}
	}
	f.warm[node], f.runtime[node], f.fences[node] = true, runtime, fences
}

// Checkpoint checkpoints as a node's agent does through the node's
// runtime: only a warm agent that reaches it can.
func (f *fakePacker) Checkpoint(_ context.Context, node string, req agent.CheckpointRequest) (agent.CheckpointResult, error) {
	w := f.w
	w.record("checkpoint %s/%s/%s on %s", req.Namespace, req.Pod, req.Container, node)
	if req.LazyPages {
		w.record("the pages of %s/%s/%s stay in the source", req.Namespace, req.Pod, req.Container)
	}
	f.mu.Lock()
	reaches := f.runtime[node]
	f.mu.Unlock()
	if !reaches {
		return agent.CheckpointResult{}, fmt.Errorf("checkpoint %s/%s on node %s: no agent there reaches the node's runtime", req.Pod, req.Container, node)
	}
	if err := w.fail(report.Checkpoint); err != nil {
		return agent.CheckpointResult{}, err
	}
	archive := agent.CheckpointDir + "/checkpoint-" + req.Pod + "_" + req.Namespace + "-" + req.Container + "-2026-12-01T09:00:00Z.tar"
	w.Mu.Lock()
	w.Archives[archive] = true
	if req.LazyPages {
		w.frozen[req.Pod], w.pageSessions[req.Pod] = true, true
	}
	st := w.Apps[req.Pod]
	w.snapshot = *st
	if st.Mode == protocol.ModePrimary && !st.PendingRestore && !w.Isolated[req.Pod] {
		// A process that serves at its checkpoint goes on serving after
		// it (the kubelet's checkpoint leaves it running): what it
		// acknowledges then, its checkpoint lacks.
		st.LastSeq += 10
		w.published = max(w.published, st.LastSeq)
		w.acked[st.Process] = st.LastSeq
	}
	after := w.AfterCheckpoint
	w.Mu.Unlock()
	if after != nil {
		after()
	}
	// The kubectl-migrate runtime leaves the pages of a container it runs
	// in the source when asked; the fake runs every container so.
	return agent.CheckpointResult{Archive: archive, LazyPages: req.LazyPages}, nil
}

// PagesResults: every lazy restore's last page arrived, unless the
// world's streams break (PagesLost).
func (f *fakePacker) PagesResults(_ context.Context, node string, ids []ociruntime.Identity) ([]agent.PagesStatus, error) {
	w := f.w
	w.record("pages of %d container(s) on %s", len(ids), node)
	w.Mu.Lock()
	lost := w.PagesLost
	ended := map[string]bool{}
	for _, id := range ids {
		// Only a pod that served or took pages has a session's result;
		// a source's session has ended, which thawed it.
		ended[id.Pod] = w.pageSessions[id.Pod] || w.restored[id.Pod]
		delete(w.frozen, id.Pod)
	}
	w.Mu.Unlock()
	out := make([]agent.PagesStatus, 0, len(ids))
	for _, id := range ids {
		st := agent.PagesStatus{Container: id.Container, Ended: ended[id.Pod]}
		st.Done = !lost
		if lost {
			st.Error = "no page stream from the source: EOF"
		}
		out = append(out, st)
	}
	return out, nil
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
	names := map[string]bool{}
	f.mu.Lock()
	f.warm = nil
	for _, name := range f.started {
		names[name] = true
	}
	f.started = nil
	f.mu.Unlock()
	pods, err := w.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(agentLabels).String()})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		names[p.Name] = true
	}
	for name := range names {
		if err := f.End(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// End ends agent podName by deleting its request and then its pod, as the
// agents' controller deletes the pods of deleted requests.
func (f *fakePacker) End(ctx context.Context, podName string) error {
	f.w.record("end agent %s", podName)
	if err := f.w.Client.CoreV1().Secrets("default").Delete(ctx, podName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := f.w.Client.CoreV1().Pods("default").Delete(ctx, podName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// AgentRequests names the agent requests no one has ended: a migration,
// finished or recovered, leaves none.
func (w *World) AgentRequests() []string {
	list, err := w.Client.CoreV1().Secrets("default").List(context.Background(), metav1.ListOptions{LabelSelector: labels.SelectorFromSet(agentLabels).String()})
	if err != nil {
		return []string{err.Error()}
	}
	var names []string
	for _, r := range list.Items {
		names = append(names, r.Name)
	}
	return names
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
