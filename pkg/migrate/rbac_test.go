package migrate_test

import (
	"bytes"
	"os"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

// TestDocumentedRBACGrantsWhatPreflightChecks: docs/rbac.yaml grants every
// access preflight checks for, namespaced ones in the role bound per
// namespace and cluster-scoped ones in the nodes role, so a user who
// applies it passes preflight.
func TestDocumentedRBACGrantsWhatPreflightChecks(t *testing.T) {
	data, err := os.ReadFile("../../docs/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]rbacv1.ClusterRole{}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		var role rbacv1.ClusterRole
		if err := yaml.UnmarshalStrict(doc, &role); err != nil {
			t.Fatal(err)
		}
		roles[role.Name] = role
	}
	grants := func(role string, p migrate.Permission) bool {
		resource := p.Resource
		if p.Subresource != "" {
			resource += "/" + p.Subresource
		}
		return slices.ContainsFunc(roles[role].Rules, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.APIGroups, p.Group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, p.Verb)
		})
	}
	for _, p := range migrate.NeededPermissions(true) {
		role := "kubectl-migrate"
		if !p.Namespaced {
			role = "kubectl-migrate-nodes"
		}
		if !grants(role, p) {
			t.Errorf("docs/rbac.yaml's %s does not grant %s %s/%s (group %q)", role, p.Verb, p.Resource, p.Subresource, p.Group)
		}
	}
}
