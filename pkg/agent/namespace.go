package agent

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Who may own the agents' namespace. Agents run there as root on their
// node, with the migration's secrets (the journal key, copies of registry
// secrets): whoever is bound to a role there owns every later migration.
const (
	// AgentsRole is the one Role of docs/rbac.yaml in the agents'
	// namespace: a RoleBinding to it makes a migrator, not an owner.
	AgentsRole = "kubectl-migrate-agents"
)

// controllerBinding reports whether b is node-setup's: the controller's
// Role bound to its service account alone.
func controllerBinding(b rbacv1.RoleBinding, namespace string) bool {
	return b.RoleRef.Kind == "Role" && b.RoleRef.Name == ControllerName && len(b.Subjects) == 1 &&
		b.Subjects[0].Kind == rbacv1.ServiceAccountKind && b.Subjects[0].Name == ControllerName && b.Subjects[0].Namespace == namespace
}

// CheckNamespace refuses an agents' namespace that someone else could own
// (one a tenant created before the project's, to read what later agents
// hold): it must carry the project's label, and grant no role but the
// agents' (AgentsRole) and the controller's through RoleBindings. A namespace that does not
// exist yet passes: the migration creates it, labelled. Cluster-wide
// grants are the cluster administrator's, and not looked at.
func CheckNamespace(ctx context.Context, client kubernetes.Interface, namespace string) error {
	ns, err := client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("read the agents' namespace %s: %w", namespace, err)
	case ns.Labels[kube.ManagedByLabel] != kube.ManagedBy:
		return fmt.Errorf("the agents' namespace %s was not made by %s (no label %s=%s): whoever made it may own the agents it would run as root; have an administrator delete it and apply docs/rbac.yaml, or pass --agent-namespace",
			namespace, version.Command(), kube.ManagedByLabel, kube.ManagedBy)
	}
	bindings, err := client.RbacV1().RoleBindings(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the RoleBindings of the agents' namespace %s, to know who else acts there (docs/rbac.yaml grants it): %w", namespace, err)
	}
	var owners []string
	for _, b := range bindings.Items {
		if b.RoleRef.Kind == "Role" && b.RoleRef.Name == AgentsRole || controllerBinding(b, namespace) {
			continue
		}
		var who []string
		for _, s := range b.Subjects {
			who = append(who, s.Kind+" "+s.Name)
		}
		owners = append(owners, fmt.Sprintf("%s (%s %s to %s)", b.Name, b.RoleRef.Kind, b.RoleRef.Name, strings.Join(who, ", ")))
	}
	if len(owners) > 0 {
		slices.Sort(owners)
		return fmt.Errorf("the agents' namespace %s grants more than Role %s, so others can act where the agents run as root: RoleBinding %s; have an administrator remove them, or pass --agent-namespace with a namespace of your own",
			namespace, AgentsRole, strings.Join(owners, "; RoleBinding "))
	}
	return nil
}
