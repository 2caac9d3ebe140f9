package migrate

import (
	"cmp"
	"context"
	"fmt"
	"path"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	volumehelpers "k8s.io/component-helpers/storage/volume"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/broker"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// preflight checks everything it can see before anything changes, and
// changes nothing itself: it has nothing to undo and journals nothing. The
// checks only agents can make (pulls, the runtime's restore setting, the
// emptyDir's size) run in setup, which starts the agents.
type preflight struct{}

func (preflight) Name() report.PhaseName { return report.Preflight }

func (preflight) traits() traits { return traits{unjournaled: true} }

func (preflight) Rollback(context.Context, *Migration) error { return nil }

func (preflight) Run(ctx context.Context, m *Migration) error {
	checks := []struct {
		what string
		fn   func(context.Context, *Migration) error
	}{
		// Before anything else: a caller short of a permission hears all it
		// lacks at once.
		{"permissions", checkPermissions},
		{"agents' namespace", checkAgentNamespace},
		// Who holds the lock is said here; setup takes it.
		{"lock", func(ctx context.Context, m *Migration) error { return m.checkLeasesFree(ctx) }},
		{"source pod", checkSourcePod},
		{"target node", checkTargetNode},
		{"volumes", checkVolumes},
		{"target pod name", checkTargetName},
		{"broker", checkBroker},
		{"registry", checkRegistry},
		{"control token", checkControlToken},
		{"application", checkApp},
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
			return fmt.Errorf("pod %s belongs to StatefulSet %s; use kubectl migrate sts", m.config.Pod, owner.Name)
		case "ReplicaSet":
			if err := checkReplicaSet(ctx, m, pod, owner.Name); err != nil {
				return err
			}
		default:
			return fmt.Errorf("pod %s is controlled by %s %s, which would replace it on the source node; only bare pods, Deployments' and ReplicaSets' pods migrate with kubectl migrate pod", m.config.Pod, owner.Kind, owner.Name)
		}
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
	if m.config.Transfer != Direct && m.config.RegistrySecret == "" {
		// The kubelet lets any pod use an image pulled anonymously.
		if !m.config.AllowAnonymousCheckpoints {
			return fmt.Errorf("the checkpoint image (the process's memory) would be pushed to %s and pulled without credentials: any pod on %s could run it, and anyone who reaches the registry read it; pass --registry-secret for a registry that asks for credentials, --transfer direct, or --allow-anonymous-checkpoints to accept that (docs/security.md)", m.config.ImageRepository, m.config.TargetNode)
		}
		m.progress(report.Preflight, "the checkpoint image is pulled without credentials (--allow-anonymous-checkpoints): any pod on "+m.config.TargetNode+
			" may run it while the node keeps it")
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
		how := "use kubectl migrate sts --mode sequential, whose source stops before its copy exists"
		if m.config.StatefulSet == "" {
			how = "use a ReadWriteMany volume"
		}
		return fmt.Errorf("PersistentVolumeClaim %s is not ReadWriteMany, but source and target use it on two nodes at once; %s", claim, how)
	}
	return nil
}

// NodeReady reports whether n's Ready condition is true.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// permission is one access the migration needs, with why.
type permission struct {
	group, verb, resource, subresource string
	namespaced                         bool
	why                                string
}

// permissions is every access a migration of a bare pod makes, so that a
// caller short of one hears it from preflight, before anything changed
// (docs/rbac.yaml grants exactly these; a test keeps the two equal).
var permissions = []permission{
	{"", "get", "pods", "", true, "to read the source, the target and the agents"},
	{"", "list", "pods", "", true, "to watch the pods it waits for"},
	{"", "watch", "pods", "", true, "to wait for the restored pod and the agents"},
	{"", "create", "pods", "", true, "to create the restored pod and the agent pods"},
	{"", "delete", "pods", "", true, "to remove the source and the agent pods"},
	{"", "patch", "pods", "", true, "to hand a Deployment's pod's copy to its ReplicaSet"},
	{"", "create", "pods", "proxy", true, "to send control messages to the application"},
	{"", "get", "pods", "proxy", true, "to read the application's state"},
	{"", "get", "configmaps", "", true, "to read the migration's record"},
	{"", "list", "configmaps", "", true, "to list migration records"},
	{"", "create", "configmaps", "", true, "to record the migration"},
	{"", "update", "configmaps", "", true, "to keep the migration's journal"},
	{"events.k8s.io", "create", "events", "", true, "to tell the pods' Events what the migration did (kubectl describe pod)"},
	{"coordination.k8s.io", "get", "leases", "", true, "to see whether another migration holds the pod"},
	{"coordination.k8s.io", "create", "leases", "", true, "to lock the pod while it moves"},
	{"coordination.k8s.io", "update", "leases", "", true, "to renew the lock"},
	{"coordination.k8s.io", "delete", "leases", "", true, "to release the lock"},
	{"apps", "get", "replicasets", "", true, "to check a Deployment's pod's ReplicaSet"},
	{"apps", "get", "deployments", "", true, "to check that a Deployment is not rolling out"},
	{"", "get", "nodes", "", false, "to check the source and target nodes"},
	{"", "create", "nodes", "proxy", false, "to checkpoint through the kubelet API"},
	{RestorePermission.Group, RestorePermission.Verb, RestorePermission.Resource, "", true, "to create a pod the kubectl-migrate runtime restores (node-setup's admission policy asks)"},
}

// journalKeyPermissions read (and, the first time, create) the key
// journals are signed with, in the agents' namespace.
func journalKeyPermissions(agents string) []Permission {
	return []Permission{
		{Verb: "get", Resource: "secrets", Name: JournalKeySecret, Namespaced: true, Namespace: agents, Why: "to sign the migration's journal"},
		{Verb: "create", Resource: "secrets", Namespaced: true, Namespace: agents, Why: "to create the journal key on the first migration"},
	}
}

// ControlTokenPermission reads the one Secret of the namespace the
// migration needs: the applications' control token.
var ControlTokenPermission = Permission{Verb: "get", Resource: "secrets", Name: ms2m.ControlSecret, Namespaced: true, Why: "to read the applications' control token"}

// RestorePermission names no real resource: node-setup's admission policy
// admits a pod under the kubectl-migrate RuntimeClass only from who holds
// it in the pod's namespace, so that a pod no migration created cannot
// be restored into.
var RestorePermission = struct{ Group, Verb, Resource string }{"kubectl-migrate.io", "create", "restores"}

var statefulSetPermissions = []permission{
	{"apps", "get", "statefulsets", "", true, "to save the StatefulSet's spec"},
	{"apps", "delete", "statefulsets", "", true, "to orphan its pods while the pod moves"},
	{"apps", "create", "statefulsets", "", true, "to create it again, adopting the moved pod"},
}

// agentPermissions are needed in the agents' namespace.
var agentPermissions = []permission{
	{"", "get", "pods", "", true, "to read the agents"},
	{"", "list", "pods", "", true, "to find the migration's agents"},
	{"", "watch", "pods", "", true, "to wait for the agents"},
	{"", "create", "pods", "", true, "to start the agents"},
	{"", "delete", "pods", "", true, "to remove the agents"},
	{"", "create", "pods", "proxy", true, "to call the agents"},
	{"", "get", "pods", "proxy", true, "to ask whether an agent is ready"},
	{"rbac.authorization.k8s.io", "list", "rolebindings", "", true, "to know who else acts where the agents run (agent.CheckNamespace)"},
}

// registrySecretPermissions are needed when the agents push with a
// registry secret, which they get a copy of in their namespace.
var registrySecretPermissions = []permission{
	{"", "get", "secrets", "", true, "to read the registry secret the agents push with"},
}

// pullSecretPermissions are needed when the container runtime may restore
// a checkpoint sent without a registry: the restored pod pulls it from its
// node's agent with a secret of its own (pullsecret.go). Never get: the
// one Secret of the namespace the migration reads is the control token.
var pullSecretPermissions = []permission{
	{"", "create", "secrets", "", true, "to give the restored pod the secret it pulls its checkpoint with"},
	{"", "update", "secrets", "", true, "to renew that secret in a recovery"},
	{"", "patch", "secrets", "", true, "to make the restored pod that secret's owner"},
	{"", "delete", "secrets", "", true, "to remove that secret when the restore is undone"},
}

var agentSecretPermissions = []permission{
	{"", "create", "secrets", "", true, "to give the agents their copy of the registry secret"},
	{"", "delete", "secrets", "", true, "to remove the agents' copy of the registry secret"},
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

func checkPermissions(ctx context.Context, m *Migration) error {
	missing, err := MissingPermissions(ctx, m.deps.Client, m.config)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing permissions in namespace %s, grant them with RBAC (docs/rbac.yaml has them all): %s", m.config.Namespace, strings.Join(missing, "; "))
	}
	return nil
}

// MissingPermissions lists, each with why, the accesses migration c needs
// and the caller lacks.
func MissingPermissions(ctx context.Context, client kubernetes.Interface, c Config) ([]string, error) {
	return Missing(ctx, client, c.Namespace, NeededPermissions(c))
}

// Missing lists, each with why, the accesses of needed the caller lacks,
// namespaced ones in namespace ("" for all namespaces) unless they name
// their own, as the API server's SelfSubjectAccessReviews answer (asked all
// at once).
func Missing(ctx context.Context, client kubernetes.Interface, namespace string, needed []Permission) ([]string, error) {
	missing := make([]string, len(needed))
	g, ctx := errgroup.WithContext(ctx)
	for i, p := range needed {
		g.Go(func() error {
			attrs := &authzv1.ResourceAttributes{Group: p.Group, Verb: p.Verb, Resource: p.Resource, Subresource: p.Subresource, Name: p.Name}
			if p.Namespaced {
				attrs.Namespace = cmp.Or(p.Namespace, namespace)
			}
			review, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
				&authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: attrs}},
				metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("check permissions: %w", err)
			}
			if !review.Status.Allowed {
				where := ""
				if p.Namespace != "" && p.Namespace != namespace {
					where = " in namespace " + p.Namespace
				}
				what := p.QualifiedResource()
				if p.Name != "" {
					what += " " + p.Name
				}
				missing[i] = fmt.Sprintf("%s %s%s (%s)", p.Verb, what, where, p.Why)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(missing, func(s string) bool { return s == "" }), nil
}

// QualifiedResource is the resource as RBAC and kubectl name it:
// resource[/subresource][.group].
func (p Permission) QualifiedResource() string {
	res := p.Resource
	if p.Subresource != "" {
		res += "/" + p.Subresource
	}
	if p.Group != "" {
		res += "." + p.Group
	}
	return res
}

// Permission is one access a command needs, with why.
type Permission struct {
	Group, Verb, Resource, Subresource string
	Namespaced                         bool
	// Namespace is where a namespaced access is needed when that is not
	// the migrated pod's namespace (the agents').
	Namespace string
	// Name restricts the access to one object ("" for all).
	Name string
	Why  string
}

// NeededPermissions lists every access migration c needs: in the pod's
// namespace, in the agents' (c.AgentNamespace, its Permissions naming it)
// and cluster-wide.
func NeededPermissions(c Config) []Permission {
	var out []Permission
	add := func(ps []permission, namespace string) {
		for _, p := range ps {
			out = append(out, Permission{Group: p.group, Verb: p.verb, Resource: p.resource, Subresource: p.subresource, Namespaced: p.namespaced, Namespace: namespace, Why: p.why})
		}
	}
	add(permissions, "")
	out = append(out, ControlTokenPermission)
	if c.StatefulSet != "" {
		add(statefulSetPermissions, "")
	}
	agents := c.Agents()
	if agents == c.Namespace {
		agents = "" // the pod's namespace has the agents' accesses already
	}
	if agents != "" {
		add(agentPermissions, agents)
		// A Role in a namespace grants get on the namespace itself.
		out = append(out, Permission{Verb: "get", Resource: "namespaces", Name: agents, Namespaced: true, Namespace: agents, Why: "to know the agents' namespace is kubectl migrate's (agent.CheckNamespace)"})
	}
	out = append(out, journalKeyPermissions(c.Agents())...)
	if c.Transfer == Direct && c.Restore != RestoreRuntime {
		add(pullSecretPermissions, "")
	}
	if c.RegistrySecret != "" {
		add(registrySecretPermissions, "")
		if agents != "" {
			add(agentSecretPermissions, agents)
		}
	}
	return out
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
	if _, err := b.QueueDepth(ctx, ms2m.MigrationQueueName(m.config.Broker.Queue)); err == nil {
		return fmt.Errorf("queue %s exists: another migration of this workload runs, or one did not end; see kubectl migrate report", ms2m.MigrationQueueName(m.config.Broker.Queue))
	} else if !broker.IsNotFound(err) {
		return err
	}
	if m.config.Strategy == MS2M {
		replay := ms2m.ReplayQueueName(m.config.Broker.Queue)
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

func checkRegistry(ctx context.Context, m *Migration) error {
	if m.config.Transfer == Direct {
		return nil // the agents check their own way: see startAgents
	}
	return m.deps.Registry.CheckPush(ctx, m.config.ImageRepository)
}

func checkControlToken(ctx context.Context, m *Migration) error {
	token, err := ControlToken(ctx, m.deps.Client, m.config.Namespace)
	m.config.ControlToken = token
	return err
}

// ControlToken reads the control token of the applications in namespace
// (contract 4), which every call to them carries.
func ControlToken(ctx context.Context, client kubernetes.Interface, namespace string) (string, error) {
	s, err := client.CoreV1().Secrets(namespace).Get(ctx, ms2m.ControlSecret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("namespace %s has no Secret %s, whose token its MS2M applications take control calls with: create it with kubectl migrate control-token -n %s and mount it in the application's pods at %s (docs/contract.md, \"Control token\")",
			namespace, ms2m.ControlSecret, namespace, path.Dir(ms2m.DefaultTokenFile))
	}
	if err != nil {
		return "", fmt.Errorf("read the control token: %w", err)
	}
	token := strings.TrimSpace(string(s.Data[ms2m.TokenKey]))
	if token == "" {
		return "", fmt.Errorf("the Secret %s in namespace %s has no %q key: put the applications' control token there", ms2m.ControlSecret, namespace, ms2m.TokenKey)
	}
	return token, nil
}

func checkApp(ctx context.Context, m *Migration) error {
	st, err := m.deps.App.State(ctx, m.sourceApp())
	if err != nil {
		return err
	}
	if st.Contract > ms2m.ContractVersion {
		return fmt.Errorf("the application in pod %s speaks MS2M contract version %d, this kubectl-migrate only up to %d; upgrade kubectl-migrate", m.config.Pod, st.Contract, ms2m.ContractVersion)
	}
	if st.Contract < ms2m.TokenContract {
		return fmt.Errorf("the application in pod %s speaks MS2M contract version %d, whose control endpoint takes calls from any pod of the cluster; upgrade it to version %d (docs/contract.md, \"Control token\")", m.config.Pod, max(st.Contract, 1), ms2m.TokenContract)
	}
	if st.Mode != ms2m.ModePrimary {
		return fmt.Errorf("the application in pod %s is in %s mode, not consuming its primary queue; is a migration already running?", m.config.Pod, st.Mode)
	}
	if st.PendingRestore {
		return fmt.Errorf("pod %s is marked for a checkpoint already; is a migration already running?", m.config.Pod)
	}
	m.state.SourceState = st
	return nil
}
