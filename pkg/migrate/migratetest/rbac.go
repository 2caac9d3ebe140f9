package migratetest

import (
	"bytes"
	"os"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

// DocumentedRoles reads the ClusterRoles and Roles of docs/rbac.yaml (at path) and
// returns whether the named role grants a permission.
func DocumentedRoles(t *testing.T, path string) (grants func(role string, p migrate.Permission) bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]rbacv1.ClusterRole{}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var kind metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &kind); err != nil {
			t.Fatal(err)
		}
		if kind.Kind != "ClusterRole" && kind.Kind != "Role" {
			continue // the agents' Namespace
		}
		var role rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict(doc, &role); err != nil {
			t.Fatal(err)
		}
		roles[role.Name] = role
	}
	return func(role string, p migrate.Permission) bool {
		resource := p.Resource
		if p.Subresource != "" {
			resource += "/" + p.Subresource
		}
		return slices.ContainsFunc(roles[role].Rules, func(r rbacv1.PolicyRule) bool {
			named := len(r.ResourceNames) == 0 || p.Name != "" && slices.Contains(r.ResourceNames, p.Name)
			return slices.Contains(r.APIGroups, p.Group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, p.Verb) && named
		})
	}
}
