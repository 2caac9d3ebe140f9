package plugin

import (
	"context"
	"fmt"
	"io"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
)

// controllerReadyTimeout bounds the wait for the agents' controller to run
// (its image pulled on some node).
const controllerReadyTimeout = 3 * time.Minute

// ensureAgentsController installs, or brings to this version, the agents'
// namespace, the controller that builds the agent pods migrations request,
// and the admission policy that vets requests; then waits until the
// controller runs.
func ensureAgentsController(ctx context.Context, client kubernetes.Interface, namespace, image, apiServer string, progress io.Writer) error {
	if err := agent.CheckNamespace(ctx, client, namespace); err != nil {
		return err
	}
	if err := agent.EnsureNamespace(ctx, client, namespace); err != nil {
		return fmt.Errorf("create the agents' namespace %s: %w", namespace, err)
	}
	policy, binding := agent.RequestPolicy(namespace)
	admission := client.AdmissionregistrationV1()
	if err := kube.Upsert(ctx, admission.ValidatingAdmissionPolicies(), policy, "ValidatingAdmissionPolicy"); err != nil {
		return err
	}
	if err := kube.Upsert(ctx, admission.ValidatingAdmissionPolicyBindings(), binding, "ValidatingAdmissionPolicyBinding"); err != nil {
		return err
	}
	sa, role, roleBinding, clusterRole, clusterBinding, deploy := agent.ControllerObjects(namespace, image, apiServer)
	rbac := client.RbacV1()
	for _, step := range []func() error{
		func() error {
			return kube.Upsert(ctx, client.CoreV1().ServiceAccounts(namespace), sa, "ServiceAccount")
		},
		func() error { return kube.Upsert(ctx, rbac.Roles(namespace), role, "Role") },
		func() error { return kube.Upsert(ctx, rbac.RoleBindings(namespace), roleBinding, "RoleBinding") },
		func() error { return kube.Upsert(ctx, rbac.ClusterRoles(), clusterRole, "ClusterRole") },
		func() error {
			return kube.Upsert(ctx, rbac.ClusterRoleBindings(), clusterBinding, "ClusterRoleBinding")
		},
		func() error { return kube.Upsert(ctx, client.AppsV1().Deployments(namespace), deploy, "Deployment") },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	fmt.Fprintf(progress, "agents' controller (%s/%s, %s): ", namespace, agent.ControllerName, image)
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, controllerReadyTimeout, true, func(ctx context.Context) (bool, error) {
		d, err := client.AppsV1().Deployments(namespace).Get(ctx, agent.ControllerName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		// Available is not serving yet: a migration's preflight looks for
		// the lease the serving replica holds.
		return controllerAvailable(d) && agent.CheckController(ctx, client, namespace, time.Now()) == nil, nil
	})
	if err != nil {
		fmt.Fprintln(progress, "not running")
		return fmt.Errorf("the agents' controller does not run after %s (kubectl -n %s describe deployment %s tells why; can the nodes pull %s?): %w", controllerReadyTimeout, namespace, agent.ControllerName, image, err)
	}
	fmt.Fprintln(progress, "running")
	return nil
}

// controllerAvailable holds once the Deployment's current version runs.
func controllerAvailable(d *appsv1.Deployment) bool {
	return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas >= 1 && d.Status.AvailableReplicas >= 1 &&
		d.Status.Replicas == d.Status.UpdatedReplicas
}
