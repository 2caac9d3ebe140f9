package drain

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

// The drain's own accesses, beside its migrations'.
var (
	// nodeAccess is checked cluster-wide: nodes are not namespaced, and the
	// targets' load counts every namespace's pods.
	nodeAccess = []migrate.Permission{
		{Verb: "get", Resource: "nodes", Why: "to read the node and its targets"},
		{Verb: "list", Resource: "nodes", Why: "to pick target nodes"},
		{Verb: "patch", Resource: "nodes", Why: "to cordon the node"},
		{Verb: "list", Resource: "pods", Namespaced: true, Why: "to find the node's pods and each target's load, in every namespace"},
	}
	// recordAccess is in the drain's namespace: its record and its lock on
	// the node.
	recordAccess = []migrate.Permission{
		{Verb: "get", Resource: "configmaps", Namespaced: true, Why: "to read the drain's record"},
		{Verb: "create", Resource: "configmaps", Namespaced: true, Why: "to record the drain"},
		{Verb: "update", Resource: "configmaps", Namespaced: true, Why: "to keep the drain's record"},
		{Group: "coordination.k8s.io", Verb: "get", Resource: "leases", Namespaced: true, Why: "to see whether another drain holds the node"},
		{Group: "coordination.k8s.io", Verb: "create", Resource: "leases", Namespaced: true, Why: "to lock the node while it drains"},
		{Group: "coordination.k8s.io", Verb: "update", Resource: "leases", Namespaced: true, Why: "to renew the lock"},
		{Group: "coordination.k8s.io", Verb: "delete", Resource: "leases", Namespaced: true, Why: "to release the lock"},
	}
	// budgetAccess is in each moved pod's namespace.
	budgetAccess = []migrate.Permission{
		{Group: "policy", Verb: "list", Resource: "poddisruptionbudgets", Namespaced: true, Why: "to find the budgets of the pods it moves"},
		{Group: "policy", Verb: "get", Resource: "poddisruptionbudgets", Namespaced: true, Why: "to read how many disruptions each allows"},
	}
	// evictAccess is in each namespace with a pod --evict-rest evicts.
	evictAccess = []migrate.Permission{
		{Verb: "create", Resource: "pods", Subresource: "eviction", Namespaced: true, Why: "to evict the pods it does not move (--evict-rest)"},
		{Verb: "watch", Resource: "pods", Namespaced: true, Why: "to wait until an evicted pod is gone"},
	}
)

// NeededPermissions maps each namespace ("" for the cluster-wide ones) to
// the accesses draining plan with cfg needs there: the drain's own and
// every migration's.
func NeededPermissions(cfg Config, plan Plan) map[string][]migrate.Permission {
	needed := map[string][]migrate.Permission{"": nodeAccess}
	add := func(ns string, ps []migrate.Permission) {
		for _, p := range ps {
			if !slices.Contains(needed[ns], p) {
				needed[ns] = append(needed[ns], p)
			}
		}
	}
	add(cfg.Namespace, recordAccess)
	for _, mv := range plan.Moves {
		for _, p := range migrate.NeededPermissions(cfg.migration(mv)) {
			add(cmp.Or(p.Namespace, mv.Pod.Namespace), []migrate.Permission{p})
		}
		add(mv.Pod.Namespace, budgetAccess)
	}
	if cfg.EvictRest {
		for _, s := range plan.Skipped {
			if s.Evictable {
				add(s.Namespace, evictAccess)
			}
		}
	}
	return needed
}

// MissingPermissions lists, each as "namespace: verb resource (why)", the
// accesses draining plan with cfg needs and the caller lacks, so that a
// drain short of one stops before it cordons the node or moves a pod.
func MissingPermissions(ctx context.Context, client kubernetes.Interface, cfg Config, plan Plan) ([]string, error) {
	needed := NeededPermissions(cfg, plan)
	var missing []string
	for _, ns := range slices.Sorted(maps.Keys(needed)) {
		lacked, err := migrate.Missing(ctx, client, ns, needed[ns])
		if err != nil {
			return nil, err
		}
		where := "namespace " + ns
		if ns == "" {
			where = "cluster-wide"
		}
		for _, l := range lacked {
			missing = append(missing, fmt.Sprintf("%s: %s", where, l))
		}
	}
	return missing, nil
}
