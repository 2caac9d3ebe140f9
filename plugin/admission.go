package plugin

import (
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// admissionPolicy admits a pod under the kubectl-migrate RuntimeClass only
// from who may migrate in its namespace: create on restores.kubectl-migrate.io
// there (a permission of migrate.RestorePermission's, which no built-in
// role holds and a namespace's admin cannot grant). Anyone else's such pod
// is refused before any node sees it.
func admissionPolicy() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	match := &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
		RuleWithOperations: admissionv1.RuleWithOperations{
			Operations: []admissionv1.OperationType{admissionv1.Create},
			Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
		},
	}}}
	conditions := []admissionv1.MatchCondition{{
		Name:       "under-the-runtime-class",
		Expression: fmt.Sprintf("has(object.spec.runtimeClassName) && object.spec.runtimeClassName == %q", ociruntime.HandlerName),
	}}
	return agent.DenyPolicy(ociruntime.HandlerName+"-runtime-class", match, conditions,
		agent.MayMigrate("request.namespace", "pods under RuntimeClass "+ociruntime.HandlerName+" are restored by migrations"))
}
