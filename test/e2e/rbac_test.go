//go:build e2e

package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// applyDocumentedRoles applies docs/rbac.yaml (its roles and the agents'
// namespace) exactly as a user would: with kubectl apply.
func (l *lab) applyDocumentedRoles(t *testing.T) {
	t.Helper()
	if out, err := l.kubectlCommand("apply", "-f", "../../docs/rbac.yaml").CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply -f docs/rbac.yaml: %v\n%s", err, out)
	}
}

// serviceAccountKubeconfig writes a kubeconfig that acts as service account
// name in namespace (a fresh token), against the lab's API server.
func (l *lab) serviceAccountKubeconfig(t *testing.T, namespace, name string) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := l.client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token, err := l.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := clientcmd.LoadFromFile(env(t, "KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = cluster
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token.Status.Token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: name, Namespace: namespace}
	cfg.CurrentContext = name
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLeastPrivilege migrates a live pod as a service account bound to
// exactly docs/rbac.yaml. Bound to the namespaced role alone, the migration
// is refused in preflight naming every cluster-scoped access it lacks and
// every one in the agents' namespace, in one line, leaving nothing (no
// lease, no record); with the nodes role and the agents' role bound too
// (which grant no create on nodes/proxy, the kubelets' API), it migrates the
// pod with every message conserved.
func TestLeastPrivilege(t *testing.T) {
	l := setup(t)
	w := l.deploy(t, "10")
	ctx := context.Background()
	l.applyDocumentedRoles(t)
	kubeconfig := l.serviceAccountKubeconfig(t, w.Namespace, "migrator")
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "migrator", Namespace: w.Namespace}}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubectl-migrate", Namespace: w.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubectl-migrate"},
		Subjects:   subject,
	}
	if _, err := l.client.RbacV1().RoleBindings(w.Namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := waitApplied(t, w, "consumer", 30)

	_, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--kubeconfig", kubeconfig)
	if err == nil || !strings.Contains(stderr, "missing permissions") || !strings.Contains(stderr, "get nodes") || strings.Contains(stderr, "nodes/proxy") ||
		!strings.Contains(stderr, "create secrets in namespace "+agent.DefaultNamespace) || !strings.Contains(stderr, "create pods/proxy in namespace "+agent.DefaultNamespace) {
		t.Fatalf("without the nodes and agents roles: %v\n%s", err, stderr)
	}
	if records, err := (report.Store{Client: l.client}).List(ctx, w.Namespace); err != nil || len(records) != 0 {
		t.Fatalf("a refused migration left %d records (%v)", len(records), err)
	}
	l.nothingLeft(t, w)

	nodes := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubectl-migrate-nodes-" + w.Namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubectl-migrate-nodes"},
		Subjects:   subject,
	}
	if _, err := l.client.RbacV1().ClusterRoleBindings().Create(ctx, nodes, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.client.RbacV1().ClusterRoleBindings().Delete(context.Background(), nodes.Name, metav1.DeleteOptions{})
	})
	agents := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubectl-migrate-agents-" + w.Namespace, Namespace: agent.DefaultNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kubectl-migrate-agents"},
		Subjects:   subject,
	}
	if _, err := l.client.RbacV1().RoleBindings(agent.DefaultNamespace).Create(ctx, agents, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.client.RbacV1().RoleBindings(agent.DefaultNamespace).Delete(context.Background(), agents.Name, metav1.DeleteOptions{})
	})
	// The kubelets' API is not the migrator's: its checkpoint goes through
	// the source node's agent and runtime.
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + w.Namespace + ":migrator",
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + w.Namespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "create", Resource: "nodes", Subresource: "proxy", Name: "node-a"},
	}}
	if review, err := l.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{}); err != nil || review.Status.Allowed {
		t.Fatalf("docs/rbac.yaml lets the migrator create nodes/proxy (the kubelet's whole API): %v %+v", err, review.Status)
	}
	rec, stderr, err := l.migrate(t, w, "pod", "consumer", "--to", "node-b", "--kubeconfig", kubeconfig)
	if err != nil {
		t.Fatalf("with docs/rbac.yaml bound: %v\n%s", err, stderr)
	}
	l.checkMigrated(t, w, rec, before)
	checkConservation(t, w, rec.TargetPod)
	l.nothingLeft(t, w)
}
