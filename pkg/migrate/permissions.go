package migrate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// The accesses a migration makes, which preflight asks the API server about
// before it changes anything (docs/rbac.yaml grants exactly these).

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
	{RestorePermission.Group, RestorePermission.Verb, RestorePermission.Resource, "", true, "to have agents act on the namespace's pods and restore into it (node-setup's admission policies ask)"},
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
var ControlTokenPermission = Permission{Verb: "get", Resource: "secrets", Name: protocol.ControlSecret, Namespaced: true, Why: "to read the applications' control token"}

// RestorePermission names no real resource: node-setup's admission
// policies admit an agent request acting on a namespace, and a pod under
// the kubectl-migrate RuntimeClass, only from who holds it in that
// namespace, so that no agent works on, and no pod is restored into, a
// namespace its requester may not migrate in.
var RestorePermission = agent.MigratePermission

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
	{"", "create", "secrets", "", true, "to ask the agents' controller for the agents (agent requests)"},
	{"", "delete", "secrets", "", true, "to end the agents (their requests)"},
	{"", "list", "events", "", true, "to read why the agents' controller refused a request"},
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
	out = append(out, Permission{Group: "coordination.k8s.io", Verb: "get", Resource: "leases", Name: agent.ControllerName, Namespaced: true, Namespace: c.Agents(), Why: "to know the agents' controller runs"})
	add(pathFor(c.Transfer, c.Restore).permissions(), "")
	if c.RegistrySecret != "" {
		add(registrySecretPermissions, "")
	}
	return out
}
