package plugin

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

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

// ensureAdmissionPolicy creates the policy and its binding, or updates
// them to this version's.
func ensureAdmissionPolicy(ctx context.Context, client kubernetes.Interface) error {
	policy, binding := admissionPolicy()
	api := client.AdmissionregistrationV1()
	if err := upsert(ctx, api.ValidatingAdmissionPolicies(), policy, "ValidatingAdmissionPolicy"); err != nil {
		return err
	}
	return upsert(ctx, api.ValidatingAdmissionPolicyBindings(), binding, "ValidatingAdmissionPolicyBinding")
}

// dropAdmissionPolicy removes them with the RuntimeClass.
func dropAdmissionPolicy(ctx context.Context, client kubernetes.Interface) error {
	policy, binding := admissionPolicy()
	api := client.AdmissionregistrationV1()
	if err := api.ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ValidatingAdmissionPolicyBinding %s: %w", binding.Name, err)
	}
	if err := api.ValidatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ValidatingAdmissionPolicy %s: %w", policy.Name, err)
	}
	return nil
}
