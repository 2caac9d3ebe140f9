package agent

import (
	"context"
	"fmt"
	"net"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
)

// MigratePermission is what the admission policies ask of whoever
// requests an agent for, or restores a pod into, a namespace: create on
// restores.kubectl-migrate.io there. No such resource exists, so no
// built-in role holds it and a namespace's admin cannot grant it.
var MigratePermission = struct{ Group, Verb, Resource string }{"kubectl-migrate.io", "create", "restores"}

// RequestPolicyName names the admission policy (and its binding) that vets
// agent requests.
const RequestPolicyName = "kubectl-migrate-agent-requests"

// RequestPolicy admits an agent request in the agents' namespace only from
// who may migrate in the namespace it names, and its removal only from who
// may migrate there too: one tenant can neither get an agent acting on
// another's pods nor end another's agents. The namespace a request names
// never changes.
func RequestPolicy(agentsNamespace string) (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	req := "(request.operation == 'DELETE' ? oldObject : object)"
	label := fmt.Sprintf("%s.metadata.labels[%q]", req, RequestNamespaceLabel)
	match := &admissionv1.MatchResources{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: agentsNamespace}},
		ResourceRules: []admissionv1.NamedRuleWithOperations{{
			RuleWithOperations: admissionv1.RuleWithOperations{
				Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update, admissionv1.Delete},
				Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"secrets"}},
			},
		}},
	}
	conditions := []admissionv1.MatchCondition{
		{Name: "an-agent-request", Expression: fmt.Sprintf("%s.type == %q", req, RequestType)},
		// The namespace controller empties a namespace being deleted.
		{Name: "not-the-control-plane", Expression: "!request.userInfo.username.startsWith('system:serviceaccount:kube-system:')"},
	}
	return DenyPolicy(RequestPolicyName, match, conditions,
		admissionv1.Validation{
			Expression: fmt.Sprintf("has(%s.metadata.labels) && %q in %s.metadata.labels", req, RequestNamespaceLabel, req),
			Message:    "an agent request names the namespace it acts for in label " + RequestNamespaceLabel,
			Reason:     ptr.To(metav1.StatusReasonInvalid),
		},
		admissionv1.Validation{
			Expression: fmt.Sprintf("request.operation != 'UPDATE' || (has(oldObject.metadata.labels) && %q in oldObject.metadata.labels && oldObject.metadata.labels[%q] == object.metadata.labels[%q])", RequestNamespaceLabel, RequestNamespaceLabel, RequestNamespaceLabel),
			Message:    "the namespace an agent request acts for never changes",
			Reason:     ptr.To(metav1.StatusReasonForbidden),
		},
		MayMigrate(label, "agents act on a namespace\\'s pods for who may migrate there"))
}

// DenyPolicy is a policy named name that refuses, where match and
// conditions hold, what fails a validation, and its binding.
func DenyPolicy(name string, match *admissionv1.MatchResources, conditions []admissionv1.MatchCondition, validations ...admissionv1.Validation) (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	meta := metav1.ObjectMeta{Name: name, Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}}
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: meta,
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy:    ptr.To(admissionv1.Fail),
			MatchConstraints: match,
			MatchConditions:  conditions,
			Validations:      validations,
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: meta,
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
	return policy, binding
}

// MayMigrate is the validation that the requester holds MigratePermission
// in the namespace the CEL expression namespace names; why opens its
// refusal (a CEL string's content).
func MayMigrate(namespace, why string) admissionv1.Validation {
	p := MigratePermission
	return admissionv1.Validation{
		Expression: fmt.Sprintf("authorizer.group(%q).resource(%q).namespace(%s).check(%q).allowed()", p.Group, p.Resource, namespace, p.Verb),
		MessageExpression: fmt.Sprintf("'%s: ' + request.userInfo.username + ' may not %s %s.%s in namespace ' + %s + ' (docs/rbac.yaml, ClusterRole kubectl-migrate)'",
			why, p.Verb, p.Resource, p.Group, namespace),
		Reason: ptr.To(metav1.StatusReasonForbidden),
	}
}

// PolicySince returns when RequestPolicy came into force (its binding's
// creation), or why it is not in force.
func PolicySince(ctx context.Context, client kubernetes.Interface) (time.Time, error) {
	api := client.AdmissionregistrationV1()
	policy, err := api.ValidatingAdmissionPolicies().Get(ctx, RequestPolicyName, metav1.GetOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("ValidatingAdmissionPolicy %s: %w", RequestPolicyName, err)
	}
	binding, err := api.ValidatingAdmissionPolicyBindings().Get(ctx, RequestPolicyName, metav1.GetOptions{})
	if err != nil {
		return time.Time{}, fmt.Errorf("ValidatingAdmissionPolicyBinding %s: %w", RequestPolicyName, err)
	}
	want, _ := RequestPolicy("")
	if *policy.Spec.FailurePolicy != admissionv1.Fail || len(policy.Spec.Validations) != len(want.Spec.Validations) ||
		binding.Spec.PolicyName != RequestPolicyName || len(binding.Spec.ValidationActions) != 1 || binding.Spec.ValidationActions[0] != admissionv1.Deny {
		return time.Time{}, fmt.Errorf("ValidatingAdmissionPolicy %s or its binding is not the one node-setup installs; run kubectl migrate node-setup again", RequestPolicyName)
	}
	since := binding.CreationTimestamp.Time
	if policy.CreationTimestamp.After(since) {
		since = policy.CreationTimestamp.Time
	}
	return since, nil
}

// ControllerObjects are what runs the agents' controller in namespace
// with image, each created (or updated) by node-setup: its service account
// may read requests and create pods in namespace, and read the request
// policy, and hold its lease, nothing else. apiServer (host:port), if set, is where the
// controller reaches the API server, for clusters whose pods cannot reach
// the kubernetes Service (no kube-proxy).
func ControllerObjects(namespace, image, apiServer string) (*corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *appsv1.Deployment) {
	labels := map[string]string{kube.ManagedByLabel: kube.ManagedBy, "app.kubernetes.io/name": ControllerName}
	meta := metav1.ObjectMeta{Name: ControllerName, Namespace: namespace, Labels: labels}
	cluster := metav1.ObjectMeta{Name: ControllerName, Labels: labels}
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ControllerName, Namespace: namespace}}
	sa := &corev1.ServiceAccount{ObjectMeta: meta}
	role := &rbacv1.Role{ObjectMeta: meta, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		// Its lease: one replica serves, and migrations see that one does.
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}}
	binding := &rbacv1.RoleBinding{ObjectMeta: meta, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: ControllerName}}
	clusterRole := &rbacv1.ClusterRole{ObjectMeta: cluster, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"validatingadmissionpolicies", "validatingadmissionpolicybindings"},
		ResourceNames: []string{RequestPolicyName}, Verbs: []string{"get"},
	}}}
	clusterBinding := &rbacv1.ClusterRoleBinding{ObjectMeta: cluster, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ControllerName}}
	selector := map[string]string{"app.kubernetes.io/name": ControllerName}
	deploy := &appsv1.Deployment{ObjectMeta: meta, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To[int32](1),
		Selector: &metav1.LabelSelector{MatchLabels: selector},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{
				ServiceAccountName:            ControllerName,
				TerminationGracePeriodSeconds: ptr.To[int64](5),
				Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{
					Name: "controller", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
					Args:            []string{"controller", "--namespace", namespace, "--image", image},
					SecurityContext: Restricted(),
				}},
			},
		},
	}}
	if host, port, err := net.SplitHostPort(apiServer); err == nil {
		// The kubelet's own service variables give way to the container's.
		c := &deploy.Spec.Template.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: "KUBERNETES_SERVICE_HOST", Value: host}, corev1.EnvVar{Name: "KUBERNETES_SERVICE_PORT", Value: port})
	}
	return sa, role, binding, clusterRole, clusterBinding, deploy
}
