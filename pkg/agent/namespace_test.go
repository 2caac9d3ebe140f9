package agent

import (
	"context"
	"strings"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

func TestCheckNamespaceRefusesOneOthersOwn(t *testing.T) {
	const ns = "agents"
	ours := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}}}
	binding := func(name, kind, role string) *rbacv1.RoleBinding {
		return &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{Kind: kind, Name: role},
			Subjects:   []rbacv1.Subject{{Kind: "User", Name: name}},
		}
	}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    string // "" passes
	}{
		{"not there yet", nil, ""},
		{"ours, migrators bound", []runtime.Object{ours, binding("alice", "Role", AgentsRole)}, ""},
		{"made by someone else", []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}, "was not made by kubectl migrate (no label app.kubernetes.io/managed-by=kubectl-migrate)"},
		{"another role bound", []runtime.Object{ours, binding("alice", "Role", AgentsRole), binding("mallory", "ClusterRole", "admin"), binding("eve", "Role", "pod-creator")},
			"RoleBinding eve (Role pod-creator to User eve); RoleBinding mallory (ClusterRole admin to User mallory); have an administrator remove them"},
		{"a ClusterRole of the agents' name", []runtime.Object{ours, binding("mallory", "ClusterRole", AgentsRole)}, "RoleBinding mallory (ClusterRole kubectl-migrate-agents to User mallory)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckNamespace(context.Background(), fake.NewClientset(tc.objects...), ns)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
