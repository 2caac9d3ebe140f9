// Package drain empties a node by live-migrating what can move: every
// running pod CRIU can checkpoint (MS2M for those that carry its contract,
// checkpoint/restore for any other), bare and Deployments' pods with the
// pod migration, StatefulSet pods with the StatefulSet one, each to a node
// picked the way the scheduler would (node selector, required affinity,
// taints, room for its requests), a few at once within the limits of
// StatefulSets and PodDisruptionBudgets. What cannot move is listed with
// the reason before anything changes.
package drain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	resourcehelper "k8s.io/component-helpers/resource"
	schedulinghelper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

// Move is one pod the drain migrates.
type Move struct {
	Pod *corev1.Pod
	// StatefulSet is the owning StatefulSet's name, "" for a bare pod.
	StatefulSet string
	Target      string
	// Budgets are the PodDisruptionBudgets (namespace/name) selecting it.
	Budgets []string
}

// Name is the pod's namespace/name.
func (m Move) Name() string { return m.Pod.Namespace + "/" + m.Pod.Name }

// Skip is a pod the drain leaves where it is, and why.
type Skip struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Reason    string `json:"reason"`
	// Evictable: the eviction API may move it (--evict-rest); mirror and
	// DaemonSet pods are not, as with kubectl drain.
	Evictable bool `json:"evictable"`
}

// Plan is what a drain will do.
type Plan struct {
	Node    string
	Moves   []Move
	Skipped []Skip
}

// PlanOptions narrow where pods go and which are looked at.
type PlanOptions struct {
	// Namespace limits the drain to one namespace; "" is all of them.
	Namespace string
	// Targets (--to) or TargetSelector (--to-selector) limit the target
	// nodes; neither: any other Ready, schedulable node.
	Targets        []string
	TargetSelector labels.Selector
}

// ownPods are kubectl-migrate's own pods: they belong to a migration
// running somewhere, not to the node.
var ownPods = []string{"kubectl-migrate-agent", "kubectl-migrate-check"}

// MakePlan finds node's pods and decides, for each, whether and where it
// moves. It reads the cluster and changes nothing.
func MakePlan(ctx context.Context, client kubernetes.Interface, node string, o PlanOptions) (Plan, error) {
	plan := Plan{Node: node}
	if _, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		return plan, fmt.Errorf("node %s not found; list nodes with kubectl get nodes", node)
	} else if err != nil {
		return plan, fmt.Errorf("get node %s: %w", node, err)
	}
	targets, err := candidateNodes(ctx, client, node, o)
	if err != nil {
		return plan, err
	}
	onNode, err := client.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return plan, fmt.Errorf("list the pods on %s: %w", node, err)
	}
	pods := onNode.Items
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	budgets := map[string][]budget{}
	for i := range pods {
		pod := &pods[i]
		if pod.Spec.NodeName != node {
			continue // not every client honours the field selector
		}
		sts, reason, evictable := classify(pod)
		if reason != "" {
			plan.Skipped = append(plan.Skipped, Skip{Namespace: pod.Namespace, Pod: pod.Name, Reason: reason, Evictable: evictable})
			continue
		}
		target, why := targets.place(pod)
		if target == "" {
			plan.Skipped = append(plan.Skipped, Skip{Namespace: pod.Namespace, Pod: pod.Name, Reason: why, Evictable: true})
			continue
		}
		if _, ok := budgets[pod.Namespace]; !ok {
			if budgets[pod.Namespace], err = listBudgets(ctx, client, pod.Namespace); err != nil {
				return plan, err
			}
		}
		mv := Move{Pod: pod, StatefulSet: sts, Target: target}
		for _, b := range budgets[pod.Namespace] {
			if b.selector.Matches(labels.Set(pod.Labels)) {
				mv.Budgets = append(mv.Budgets, pod.Namespace+"/"+b.name)
			}
		}
		plan.Moves = append(plan.Moves, mv)
	}
	return plan, nil
}

// classify says how a drain moves pod (its StatefulSet, or "" for a bare
// pod), or why it does not; evictable tells whether the eviction API may
// take it.
func classify(pod *corev1.Pod) (statefulSet, reason string, evictable bool) {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return "", "it has ended (" + string(pod.Status.Phase) + ")", false
	}
	if pod.DeletionTimestamp != nil {
		return "", "it is being deleted", false
	}
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return "", "a static pod (its mirror); the node's kubelet runs it", false
	}
	if slices.Contains(ownPods, pod.Labels["app.kubernetes.io/name"]) {
		return "", "kubectl-migrate's own pod, of a migration or check that runs", false
	}
	if pod.Labels["app.kubernetes.io/name"] == agent.ControllerName {
		// Every move of the drain asks it for its agents: frozen by a
		// checkpoint it would stall them. Its Deployment starts it again
		// elsewhere, and a migration waits for it (CheckController).
		return "", "the agents' controller, which the drain's own moves need; its Deployment starts it elsewhere once evicted", true
	}
	owner := metav1.GetControllerOf(pod)
	switch {
	case owner != nil && owner.Kind == "DaemonSet":
		return "", "a DaemonSet pod; it belongs to its node", false
	case owner != nil && owner.Kind != "StatefulSet" && owner.Kind != "ReplicaSet":
		return "", fmt.Sprintf("controlled by %s %s, which would replace it on the node; only bare pods and StatefulSets', Deployments' and ReplicaSets' pods migrate", owner.Kind, owner.Name), true
	case pod.Status.Phase != corev1.PodRunning:
		return "", "not running (" + string(pod.Status.Phase) + "); only running pods can be checkpointed", true
	}
	if why := migrate.Uncheckpointable(pod); why != "" {
		return "", why, true
	}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.HostPath != nil:
			return "", "volume " + v.Name + " is a hostPath, whose data stays on the node", true
		}
	}
	if owner != nil && owner.Kind == "StatefulSet" {
		statefulSet = owner.Name
	}
	return statefulSet, "", false
}

// targetNode is a node pods may move to, with the room left on it.
type targetNode struct {
	node *corev1.Node
	free corev1.ResourceList
}

type targetNodes []*targetNode

// candidateNodes are the Ready, schedulable nodes but node that the options
// allow, with their allocatable resources less what their pods request.
func candidateNodes(ctx context.Context, client kubernetes.Interface, node string, o PlanOptions) (targetNodes, error) {
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	for _, t := range o.Targets {
		if !slices.ContainsFunc(list.Items, func(n corev1.Node) bool { return n.Name == t }) {
			return nil, fmt.Errorf("node %s (--to) not found; list nodes with kubectl get nodes", t)
		}
		if t == node {
			return nil, fmt.Errorf("--to %s is the node being drained; pick another", t)
		}
	}
	var out targetNodes
	var unusable []string
	for i := range list.Items {
		n := &list.Items[i]
		switch {
		case n.Name == node:
			continue
		case len(o.Targets) > 0 && !slices.Contains(o.Targets, n.Name):
			continue
		case o.TargetSelector != nil && !o.TargetSelector.Matches(labels.Set(n.Labels)):
			continue
		case !kube.NodeReady(n):
			unusable = append(unusable, n.Name+" is not Ready")
			continue
		case n.Spec.Unschedulable:
			unusable = append(unusable, n.Name+" is cordoned")
			continue
		}
		out = append(out, &targetNode{node: n, free: n.Status.Allocatable.DeepCopy()})
	}
	if len(out) == 0 {
		why := "no other node"
		if len(unusable) > 0 {
			why = strings.Join(unusable, ", ")
		}
		return nil, fmt.Errorf("no node to move pods to (%s); pick Ready, schedulable nodes with --to or --to-selector", why)
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, t := range out {
			if t.node.Name == p.Spec.NodeName {
				t.take(resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{}))
			}
		}
	}
	return out, nil
}

func (t *targetNode) take(requests corev1.ResourceList) {
	for name, q := range requests {
		if free, ok := t.free[name]; ok {
			free.Sub(q)
			t.free[name] = free
		}
	}
}

// fits says why pod cannot go to t, or "".
func (t *targetNode) fits(pod *corev1.Pod, requests corev1.ResourceList) string {
	if ok, err := nodeaffinity.GetRequiredNodeAffinity(pod).Match(t.node); err != nil || !ok {
		return t.node.Name + " does not match its node selector or affinity"
	}
	noSchedule := func(taint *corev1.Taint) bool {
		return taint.Effect == corev1.TaintEffectNoSchedule || taint.Effect == corev1.TaintEffectNoExecute
	}
	if taint, untolerated := schedulinghelper.FindMatchingUntoleratedTaint(klog.Background(), t.node.Spec.Taints, pod.Spec.Tolerations, noSchedule, false); untolerated {
		return fmt.Sprintf("%s has the taint %s=%s:%s, which it does not tolerate", t.node.Name, taint.Key, taint.Value, taint.Effect)
	}
	for name, q := range requests {
		free, ok := t.free[name]
		if ok && free.Cmp(q) < 0 {
			return fmt.Sprintf("%s has %s of %s left, it requests %s", t.node.Name, free.String(), name, q.String())
		}
	}
	return ""
}

// place picks the fitting node with the most CPU left (ties by name) and
// books the pod's requests there; else it says why none fits.
func (ts targetNodes) place(pod *corev1.Pod) (string, string) {
	requests := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	var best *targetNode
	var why []string
	for _, t := range ts {
		if reason := t.fits(pod, requests); reason != "" {
			why = append(why, reason)
			continue
		}
		if best == nil {
			best = t
			continue
		}
		if c := cpuLeft(t).Cmp(*cpuLeft(best)); c > 0 || c == 0 && t.node.Name < best.node.Name {
			best = t
		}
	}
	if best == nil {
		return "", "no node fits: " + strings.Join(why, "; ")
	}
	best.take(requests)
	return best.node.Name, ""
}

func cpuLeft(t *targetNode) *resource.Quantity {
	q := t.free[corev1.ResourceCPU]
	return &q
}

type budget struct {
	name     string
	selector labels.Selector
}

func listBudgets(ctx context.Context, client kubernetes.Interface, namespace string) ([]budget, error) {
	list, err := client.PolicyV1().PodDisruptionBudgets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list PodDisruptionBudgets in %s: %w", namespace, err)
	}
	var out []budget
	var errs []error
	for _, pdb := range list.Items {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil {
			errs = append(errs, fmt.Errorf("PodDisruptionBudget %s/%s: %w", namespace, pdb.Name, err))
			continue
		}
		out = append(out, budget{name: pdb.Name, selector: sel})
	}
	return out, errors.Join(errs...)
}
