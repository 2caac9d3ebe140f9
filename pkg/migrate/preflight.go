package migrate

import (
	"context"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	volumehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/broker"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// preflight checks everything it can see before anything changes, and
// changes nothing itself: it has nothing to undo and journals nothing. The
// checks only agents can make (pulls, the runtime's restore setting, the
// emptyDir's size) run in setup, which starts the agents.
type preflight struct{}

func (preflight) Name() report.PhaseName { return report.Preflight }

func (preflight) traits() traits { return traits{unjournaled: true} }

func (preflight) Rollback(context.Context, *Migration) error { return nil }

// preflightCheck is one of preflight's checks, named for its progress line.
type preflightCheck struct {
	what string
	fn   func(context.Context, *Migration) error
}

func (preflight) Run(ctx context.Context, m *Migration) error {
	checks := []preflightCheck{
		// Before anything else: a caller short of a permission hears all it
		// lacks at once.
		{"permissions", checkPermissions},
		{"agents' namespace", checkAgentNamespace},
		{"agents' controller", func(ctx context.Context, m *Migration) error {
			return agent.CheckController(ctx, m.deps.Client, m.config.Agents(), time.Now())
		}},
		// Who holds the lock is said here; setup takes it.
		{"lock", func(ctx context.Context, m *Migration) error { return m.checkLeasesFree(ctx) }},
		{"source pod", checkSourcePod},
		{"target node", checkTargetNode},
		{"volumes", checkVolumes},
		{"target pod name", checkTargetName},
		{"checkpoint's way", checkPath},
		{"lazy pages", checkLazyPages},
	}
	if m.config.Strategy.Contract() {
		checks = append(checks, preflightCheck{"broker", checkBroker}, preflightCheck{"control token", checkControlToken}, preflightCheck{"application", checkApp})
	}
	for _, c := range checks {
		if err := c.fn(ctx, m); err != nil {
			return err
		}
		m.progress(report.Preflight, c.what+" ok")
	}
	return nil
}

func checkSourcePod(ctx context.Context, m *Migration) error {
	pod, err := GetSourcePod(ctx, m.deps.Client, m.config.Namespace, m.config.Pod, m.config.ID)
	if err != nil {
		return err
	}
	if pod.DeletionTimestamp != nil {
		return fmt.Errorf("pod %s is being deleted", m.config.Pod)
	}
	if pod.Status.Phase != corev1.PodRunning || pod.Spec.NodeName == "" {
		return fmt.Errorf("pod %s is %s, not Running on a node; only running pods can be checkpointed", m.config.Pod, pod.Status.Phase)
	}
	owner := metav1.GetControllerOf(pod)
	if m.config.StatefulSet != "" {
		if owner == nil || owner.Kind != "StatefulSet" || owner.Name != m.config.StatefulSet {
			return fmt.Errorf("pod %s does not belong to StatefulSet %s", m.config.Pod, m.config.StatefulSet)
		}
	} else if owner != nil {
		switch owner.Kind {
		case "StatefulSet":
			return fmt.Errorf("pod %s belongs to StatefulSet %s; use %s sts", m.config.Pod, owner.Name, version.Command())
		case "ReplicaSet":
			if err := checkReplicaSet(ctx, m, pod, owner.Name); err != nil {
				return err
			}
		default:
			return fmt.Errorf("pod %s is controlled by %s %s, which would replace it on the source node; only bare pods, Deployments' and ReplicaSets' pods migrate with %s pod", m.config.Pod, owner.Kind, owner.Name, version.Command())
		}
	}
	if !m.config.Strategy.Contract() && pod.Annotations[QueueAnnotation] != "" {
		// Its restored copy holds until a migration names its pod, which
		// only the contract's strategies do: it would consume nothing.
		return fmt.Errorf("pod %s follows the MS2M contract (%s): its restored copy would hold, consuming nothing, as no MS2M migration named its pod; move it with --strategy %s or %s", m.config.Pod, QueueAnnotation, MS2M, StopAndCopy)
	}
	if why := Uncheckpointable(pod); why != "" {
		return fmt.Errorf("pod %s cannot be moved by a checkpoint: %s", m.config.Pod, why)
	}
	names := make([]string, 0, len(pod.Spec.Containers))
	for _, c := range pod.Spec.Containers {
		names = append(names, c.Name)
	}
	for _, c := range m.config.Containers {
		if slices.ContainsFunc(pod.Spec.InitContainers, func(ic corev1.Container) bool { return ic.Name == c }) {
			return fmt.Errorf("%q is an init container of pod %s: only its containers %v are checkpointed (a sidecar starts afresh on the target); name one of those with --container", c, m.config.Pod, names)
		}
		if !slices.Contains(names, c) {
			return fmt.Errorf("pod %s has no container %q (it has %v)", m.config.Pod, c, names)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running == nil && (len(m.config.Containers) == 0 || slices.Contains(m.config.Containers, cs.Name)) {
			return fmt.Errorf("container %s of pod %s is not running", cs.Name, m.config.Pod)
		}
	}
	m.state.Source, m.state.SourceNode = pod, pod.Spec.NodeName
	m.state.Migrated = names
	if len(m.config.Containers) > 0 {
		m.state.Migrated = m.config.Containers
	}
	m.Record.SourceNode = m.state.SourceNode
	if !m.config.Strategy.Contract() {
		// Until it takes the source's place, nothing selects the copy: no
		// Service sends it a client whose writes a rollback would lose. A
		// StatefulSet pod's copy gets the labels its StatefulSet adopts it
		// by at the switchover, before the adoption.
		m.state.HiddenLabels = slices.Sorted(maps.Keys(pod.Labels))
	}
	return nil
}

// GetSourcePod reads the pod to migrate; a missing one is explained, and
// pointed at recovery if a migration that did not end (other than self)
// holds it.
func GetSourcePod(ctx context.Context, client kubernetes.Interface, namespace, name, self string) (*corev1.Pod, error) {
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if id, held := lease.Holder(ctx, client, namespace, name); held && id != self {
			return nil, fmt.Errorf("pod %s is not there while migration %s, which did not end, holds it; finish or undo that migration: %s", name, id, RecoverCommand(namespace, id))
		}
		return nil, fmt.Errorf("pod %s not found in namespace %s; check the name and -n", name, namespace)
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s: %w", name, err)
	}
	return pod, nil
}

func checkTargetNode(ctx context.Context, m *Migration) error {
	if m.config.TargetNode == m.state.SourceNode {
		return fmt.Errorf("pod %s already runs on node %s; pick another --to node", m.config.Pod, m.config.TargetNode)
	}
	source, target, err := NodePair(ctx, m.deps.Client, m.state.SourceNode, m.config.TargetNode)
	if err != nil {
		return err
	}
	m.nodes.source, m.nodes.target = source, target
	needs := RestoreNeeds{Want: m.config.Restore, Target: target}
	if m.config.StatefulSet != "" {
		needs.Source = source
	}
	via, note, err := ChooseRestore(needs)
	if err != nil {
		return err
	}
	if note != "" {
		m.progress(report.Preflight, note)
	}
	m.state.RestoreVia, m.Record.Restore = via, string(via)
	if via == RestoreRuntime {
		// The checkpoint goes to the target's agent, which stages it.
		m.config.Transfer = Direct
	}
	return nil
}

// checkVolumes refuses volumes whose data cannot follow the migrated
// containers to the target node (an emptyDir's does: see volumes.go):
// node-local ones (hostPath, a claim
// bound to a local or hostPath volume or one whose node affinity excludes the
// target), and, when source and target run at once (a bare pod, or shadow
// mode), a claim that cannot be mounted read-write on two nodes.
func checkVolumes(ctx context.Context, m *Migration) error {
	mounted := map[string]bool{}
	for _, c := range m.state.Source.Spec.Containers {
		if slices.Contains(m.state.Migrated, c.Name) {
			for _, vm := range c.VolumeMounts {
				mounted[vm.Name] = true
			}
		}
	}
	for _, v := range m.state.Source.Spec.Volumes {
		if !mounted[v.Name] {
			continue
		}
		switch {
		case v.HostPath != nil:
			return fmt.Errorf("volume %s is hostPath %s on %s, whose data cannot follow the pod; migrate only the other containers with --container, or use a network-attached volume", v.Name, v.HostPath.Path, m.state.SourceNode)
		case v.PersistentVolumeClaim == nil:
			continue
		}
		if err := checkClaim(ctx, m, v.PersistentVolumeClaim.ClaimName); err != nil {
			return err
		}
	}
	return nil
}

func checkClaim(ctx context.Context, m *Migration, claim string) error {
	pvc, err := m.deps.Client.CoreV1().PersistentVolumeClaims(m.config.Namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get PersistentVolumeClaim %s: %w", claim, err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return fmt.Errorf("PersistentVolumeClaim %s is %s, not Bound", claim, pvc.Status.Phase)
	}
	pv, err := m.deps.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get PersistentVolume %s of claim %s (reading it needs get persistentvolumes): %w", pvc.Spec.VolumeName, claim, err)
	}
	local := ""
	switch {
	case pv.Spec.Local != nil:
		local = "a local volume at " + pv.Spec.Local.Path
	case pv.Spec.HostPath != nil:
		local = "a hostPath volume at " + pv.Spec.HostPath.Path
	}
	if local != "" {
		return fmt.Errorf("PersistentVolumeClaim %s is bound to %s, %s on %s whose data cannot follow the pod to %s; move the data to a network-attached volume first", claim, pv.Name, local, m.state.SourceNode, m.config.TargetNode)
	}
	if err := volumehelpers.CheckNodeAffinity(pv, m.nodes.target.Labels); err != nil {
		return fmt.Errorf("PersistentVolumeClaim %s is bound to %s, which node %s cannot reach (%v); pick a node its node affinity allows", claim, pv.Name, m.config.TargetNode, err)
	}
	if m.config.TargetName != m.config.Pod && !slices.Contains(pv.Spec.AccessModes, corev1.ReadWriteMany) {
		how := "use " + version.Command() + " sts --mode sequential, whose source stops before its copy exists"
		if m.config.StatefulSet == "" {
			how = "use a ReadWriteMany volume"
		}
		return fmt.Errorf("PersistentVolumeClaim %s is not ReadWriteMany, but source and target use it on two nodes at once; %s", claim, how)
	}
	return nil
}

// checkAgentNamespace refuses agents' namespace that others own. Where
// the agents run in the pod's own namespace (--agent-namespace), its
// editors are trusted with them: the caller chose so.
func checkAgentNamespace(ctx context.Context, m *Migration) error {
	if m.config.Agents() == m.config.Namespace {
		return nil
	}
	return agent.CheckNamespace(ctx, m.deps.Client, m.config.Agents())
}

func checkTargetName(ctx context.Context, m *Migration) error {
	if m.config.StatefulSet != "" {
		return nil // the pod keeps its name
	}
	_, err := m.deps.Client.CoreV1().Pods(m.config.Namespace).Get(ctx, m.config.TargetName, metav1.GetOptions{})
	if err == nil {
		return fmt.Errorf("pod %s already exists; pass another --target-name", m.config.TargetName)
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("get pod %s: %w", m.config.TargetName, err)
	}
	return nil
}

func checkBroker(ctx context.Context, m *Migration) error {
	b, err := m.deps.DialBroker(ctx, m.config.Broker.URL)
	if err != nil {
		return fmt.Errorf("%w; pass --broker-url with an address this machine reaches", err)
	}
	m.broker = b
	if err := b.CheckExchange(ctx, m.config.Broker.Exchange); err != nil {
		return err
	}
	if _, err := b.QueueDepth(ctx, m.config.Broker.Queue); err != nil {
		return fmt.Errorf("primary %w", err)
	}
	if _, err := b.QueueDepth(ctx, protocol.MigrationQueueName(m.config.Broker.Queue)); err == nil {
		return fmt.Errorf("queue %s exists: another migration of this workload runs, or one did not end; see %s report", protocol.MigrationQueueName(m.config.Broker.Queue), version.Command())
	} else if !broker.IsNotFound(err) {
		return err
	}
	if m.config.Strategy == MS2M {
		replay := protocol.ReplayQueueName(m.config.Broker.Queue)
		_, err := b.QueueDepth(ctx, replay)
		if err == nil {
			return fmt.Errorf("replay queue %s already exists: another migration of this queue is running, or one crashed; delete the queue once none runs", replay)
		}
		if !broker.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// checkPath checks what the checkpoint's way can check before the agents
// run (see startAgents for the rest).
func checkPath(ctx context.Context, m *Migration) error { return m.path().check(ctx, m) }

// checkLazyPages refuses lazy pages where the kubectl-migrate runtime
// does not run the source, or does not restore on the target, or where the
// source's liveness probe would not outlast its freeze.
func checkLazyPages(ctx context.Context, m *Migration) error {
	if m.config.Pages != PagesLazy {
		return nil
	}
	if m.state.RestoreVia != RestoreRuntime {
		return fmt.Errorf("--pages lazy restores through the kubectl-migrate runtime, which node %s does not have: run %s node-setup %s, or move with --pages eager", m.config.TargetNode, version.Command(), m.config.TargetNode)
	}
	if rc := m.state.Source.Spec.RuntimeClassName; rc == nil || *rc != ociruntime.HandlerName {
		return fmt.Errorf("pod %s does not run under RuntimeClass %s, whose runtime alone can leave its pages in the source: give its workload runtimeClassName: %s, or move it with --pages eager", m.config.Pod, ociruntime.HandlerName, ociruntime.HandlerName)
	}
	return checkProbesOutlastFreeze(ctx, m)
}

func checkControlToken(ctx context.Context, m *Migration) error {
	token, err := ControlToken(ctx, m.deps.Client, m.config.Namespace)
	m.config.ControlToken = token
	return err
}

// ControlToken reads the control token of the applications in namespace
// (contract 4), which every call to them carries.
func ControlToken(ctx context.Context, client kubernetes.Interface, namespace string) (string, error) {
	s, err := client.CoreV1().Secrets(namespace).Get(ctx, protocol.ControlSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("namespace %s has no Secret %s, whose token its MS2M applications take control calls with: create it with %s control-token -n %s and mount it in the application's pods at %s (docs/contract.md, \"Control token\")",
			namespace, protocol.ControlSecret, version.Command(), namespace, path.Dir(protocol.DefaultTokenFile))
	}
	if err != nil {
		return "", fmt.Errorf("read the control token: %w", err)
	}
	token := strings.TrimSpace(string(s.Data[protocol.TokenKey]))
	if token == "" {
		return "", fmt.Errorf("the Secret %s in namespace %s has no %q key: put the applications' control token there", protocol.ControlSecret, namespace, protocol.TokenKey)
	}
	return token, nil
}

func checkApp(ctx context.Context, m *Migration) error {
	st, err := m.deps.App.State(ctx, m.sourceApp())
	if err != nil {
		return err
	}
	if st.Contract > protocol.ContractVersion {
		return fmt.Errorf("the application in pod %s speaks MS2M contract version %d, this kubectl-migrate only up to %d; upgrade kubectl-migrate", m.config.Pod, st.Contract, protocol.ContractVersion)
	}
	if st.Contract < protocol.TokenContract {
		return fmt.Errorf("the application in pod %s speaks MS2M contract version %d, whose control endpoint takes calls from any pod of the cluster; upgrade it to version %d (docs/contract.md, \"Control token\")", m.config.Pod, max(st.Contract, 1), protocol.TokenContract)
	}
	if st.Mode != protocol.ModePrimary {
		return fmt.Errorf("the application in pod %s is in %s mode, not consuming its primary queue; is a migration already running?", m.config.Pod, st.Mode)
	}
	if st.PendingRestore {
		return fmt.Errorf("pod %s is marked for a checkpoint already; is a migration already running?", m.config.Pod)
	}
	m.state.SourceState = st
	return nil
}
