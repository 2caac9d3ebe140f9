package migrate_test

import (
	"context"
	"slices"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// TestDocumentedRBACGrantsWhatPreflightChecks: docs/rbac.yaml grants every
// access preflight checks for, namespaced ones in the role bound per
// namespace (reading a registry secret in a role of its own), the agents'
// in the role in their namespace, and cluster-scoped ones in the nodes
// role, so a user who applies it passes preflight.
func TestDocumentedRBACGrantsWhatPreflightChecks(t *testing.T) {
	t.Parallel()
	grants := migratetest.DocumentedRoles(t, "../../docs/rbac.yaml")
	needed := migrate.NeededPermissions(migrate.Config{Namespace: "app", StatefulSet: "db", RegistrySecret: "regcred"})
	needed = append(needed, migrate.NeededPermissions(migrate.Config{Namespace: "app", Transfer: migrate.Direct})...)
	for _, p := range needed {
		role := "kubectl-migrate"
		switch {
		case !p.Namespaced:
			role = "kubectl-migrate-nodes"
		case p.Namespace == agent.DefaultNamespace:
			role = "kubectl-migrate-agents"
		case p.Resource == "secrets" && p.Verb == "get" && p.Name == "":
			role = "kubectl-migrate-registry-secret"
		}
		if !grants(role, p) {
			t.Errorf("docs/rbac.yaml's %s does not grant %s %s/%s (group %q)", role, p.Verb, p.Resource, p.Subresource, p.Group)
		}
	}
}

// TestPreflightChecksEveryCallTheEngineMakes records every request the
// engine makes of the API server in migrations of every kind (bare pod and
// StatefulSet pod, each strategy and mode, direct transfer, a rollback, a
// crash and its recovery) and fails on one preflight does not check it may
// make: a caller short of an access must hear it from preflight, before
// anything changed, not halfway through.
func TestPreflightChecksEveryCallTheEngineMakes(t *testing.T) {
	t.Parallel()
	direct := testConfig(migrate.MS2M)
	direct.Transfer, direct.ImageRepository = migrate.Direct, ""
	cases := []struct {
		name  string
		world func(*testing.T) *migratetest.World
		cfg   migrate.Config
		fail  report.PhaseName
		crash int // a crash at this step, then recovery
	}{
		{name: "pod ms2m", world: newWorld, cfg: testConfig(migrate.MS2M)},
		{name: "pod stop-and-copy", world: newWorld, cfg: testConfig(migrate.StopAndCopy)},
		{name: "pod direct", world: newWorld, cfg: direct},
		{name: "pod rollback", world: newWorld, cfg: testConfig(migrate.MS2M), fail: report.Switchover},
		{name: "pod recovered", world: newWorld, cfg: testConfig(migrate.MS2M), crash: 4},
		{name: "sts sequential", world: migratetest.NewStatefulSetWorld, cfg: stsConfig(migrate.MS2M, migrate.Sequential)},
		{name: "sts stop-and-copy", world: migratetest.NewStatefulSetWorld, cfg: stsConfig(migrate.StopAndCopy, migrate.Sequential)},
		{name: "sts shadow", world: migratetest.NewStatefulSetWorld, cfg: stsConfig(migrate.MS2M, migrate.Shadow)},
		{name: "sts rollback", world: migratetest.NewStatefulSetWorld, cfg: stsConfig(migrate.MS2M, migrate.Sequential), fail: report.Switchover},
		{name: "sts shadow recovered", world: migratetest.NewStatefulSetWorld, cfg: stsConfig(migrate.MS2M, migrate.Shadow), crash: 12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.world(t)
			w.Mu.Lock() // the world's controllers read it
			w.FailAt = tc.fail
			w.Mu.Unlock()
			if tc.crash > 0 {
				recoverTwice(t, w, crashAt(t, w, tc.cfg, tc.crash))
			} else {
				_, _ = migrate.Run(context.Background(), tc.cfg, w.Deps(), migrate.Hooks{})
			}
			checked := migrate.NeededPermissions(tc.cfg)
			calls := w.APICalls()
			if len(calls) < 10 {
				t.Fatalf("recorded only %d calls", len(calls))
			}
			unchecked := map[migratetest.APICall]bool{}
			for _, c := range calls {
				if c.Group == "authorization.k8s.io" {
					continue // asking what one may do needs no permission
				}
				if !slices.ContainsFunc(checked, func(p migrate.Permission) bool {
					return p.Group == c.Group && p.Verb == c.Verb && p.Resource == c.Resource && p.Subresource == c.Subresource
				}) {
					unchecked[c] = true
				}
			}
			for c := range unchecked {
				t.Errorf("the engine calls %s %s/%s (group %q), which preflight does not check", c.Verb, c.Resource, c.Subresource, c.Group)
			}
		})
	}
}
