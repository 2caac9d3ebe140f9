package nodesetup

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// Cluster is node-setup's cluster half, beside the node half above: what
// kubectl migrate node-setup changes through the API server around each
// node's own setup. An install creates the RuntimeClass and the admission
// policy that guards it, then sets up each node in turn and labels it; an
// uninstall unlabels each node first, and drops both once no node has the
// runtime. One node at a time: a runtime restarting on one node leaves the
// others undisturbed.
type Cluster struct {
	Client kubernetes.Interface
	// OnNode runs node-setup with args on node, whose runtime is runtime
	// (Containerd or CRIO), in a pod there, and returns its report line.
	OnNode func(ctx context.Context, node, runtime string, args []string) (string, error)
	// Admission is the policy (and its binding) that admits a pod under
	// the RuntimeClass only from who may migrate in its namespace.
	Admission func() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding)
	// Restart is how the node's runtime is restarted (--restart).
	Restart string
	// Progress is told each node's outcome and what is waited for.
	Progress io.Writer
}

// Install sets up nodes.
func (c Cluster) Install(ctx context.Context, nodes []corev1.Node) error {
	if err := c.ensureRuntimeClass(ctx); err != nil {
		return err
	}
	policy, binding := c.Admission()
	api := c.Client.AdmissionregistrationV1()
	if err := kube.Upsert(ctx, api.ValidatingAdmissionPolicies(), policy, "ValidatingAdmissionPolicy"); err != nil {
		return err
	}
	if err := kube.Upsert(ctx, api.ValidatingAdmissionPolicyBindings(), binding, "ValidatingAdmissionPolicyBinding"); err != nil {
		return err
	}
	for _, n := range nodes {
		if err := c.onNode(ctx, n, true); err != nil {
			return err
		}
		if err := c.label(ctx, n.Name, true); err != nil {
			return err
		}
	}
	return nil
}

// Uninstall removes the runtime from nodes, once no pod there runs under
// it.
func (c Cluster) Uninstall(ctx context.Context, nodes []corev1.Node) error {
	if err := c.refuseWhileRestoredPodsRun(ctx, nodes); err != nil {
		return err
	}
	for _, n := range nodes {
		// First the label: nothing new is restored there meanwhile.
		if err := c.label(ctx, n.Name, false); err != nil {
			return err
		}
		if err := c.onNode(ctx, n, false); err != nil {
			return err
		}
	}
	return c.dropRuntimeClassIfUnused(ctx)
}

// onNode runs node-setup on n and waits for its node to be back.
func (c Cluster) onNode(ctx context.Context, n corev1.Node, install bool) error {
	runtime, _, _ := strings.Cut(n.Status.NodeInfo.ContainerRuntimeVersion, "://")
	args := []string{"--restart", c.Restart}
	if !install {
		args = append(args, "--uninstall")
	}
	fmt.Fprintf(c.Progress, "%s (%s): ", n.Name, n.Status.NodeInfo.ContainerRuntimeVersion)
	msg, err := c.OnNode(ctx, n.Name, runtime, args)
	if err != nil {
		fmt.Fprintln(c.Progress, "failed")
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	fmt.Fprintln(c.Progress, msg)
	// The kubelet reports the node NotReady while its runtime restarts:
	// the next node's turn comes once this one is back.
	return waitNodeReady(ctx, c.Client, n.Name, install)
}

// waitNodeReady waits until node reports Ready again, its runtime's
// version, and (where the kubelet lists its runtime's handlers, 1.30 on)
// the runtime's handler as installed says: a status the kubelet posted
// before the restart would pass the first two at once.
func waitNodeReady(ctx context.Context, client kubernetes.Interface, node string, installed bool) error {
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil || !kube.NodeReady(n) || strings.HasSuffix(n.Status.NodeInfo.ContainerRuntimeVersion, "://Unknown") {
			return false, nil
		}
		if len(n.Status.RuntimeHandlers) == 0 {
			return true, nil
		}
		listed := slices.ContainsFunc(n.Status.RuntimeHandlers, func(h corev1.NodeRuntimeHandler) bool { return h.Name == ociruntime.HandlerName })
		return listed == installed, nil
	})
	if err != nil {
		return fmt.Errorf("node %s did not report Ready again after its runtime's restart: %w", node, err)
	}
	return nil
}

// ensureRuntimeClass creates the RuntimeClass that selects the runtime's
// handler on the nodes labelled for it.
func (c Cluster) ensureRuntimeClass(ctx context.Context) error {
	rc := &nodev1.RuntimeClass{
		ObjectMeta: metav1.ObjectMeta{Name: ociruntime.HandlerName, Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy}},
		Handler:    ociruntime.HandlerName,
		Scheduling: &nodev1.Scheduling{NodeSelector: map[string]string{ociruntime.NodeLabel: "installed"}},
	}
	_, err := c.Client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create RuntimeClass %s: %w", rc.Name, err)
	}
	return nil
}

// dropRuntimeClassIfUnused deletes the RuntimeClass and its admission
// policy once no node has the runtime.
func (c Cluster) dropRuntimeClassIfUnused(ctx context.Context) error {
	left, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: ociruntime.NodeLabel})
	if err != nil {
		return err
	}
	if len(left.Items) > 0 {
		return nil
	}
	err = c.Client.NodeV1().RuntimeClasses().Delete(ctx, ociruntime.HandlerName, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete RuntimeClass %s: %w", ociruntime.HandlerName, err)
	}
	policy, binding := c.Admission()
	api := c.Client.AdmissionregistrationV1()
	if err := api.ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ValidatingAdmissionPolicyBinding %s: %w", binding.Name, err)
	}
	if err := api.ValidatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ValidatingAdmissionPolicy %s: %w", policy.Name, err)
	}
	return nil
}

// refuseWhileRestoredPodsRun refuses an uninstall from nodes where pods
// run under the RuntimeClass: their containers' runtime would be gone
// from under them (a restart, an exec, a stop would fail). Pods already
// being deleted, or whose namespace is, are waited for, as their stop
// needs the runtime too.
func (c Cluster) refuseWhileRestoredPodsRun(ctx context.Context, nodes []corev1.Node) error {
	var running, ending []string
	said := false
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		running, ending = nil, nil
		namespaces := map[string]bool{} // whether each is being deleted: asked once a poll
		nsEnding := func(ns string) bool {
			ending, asked := namespaces[ns]
			if !asked {
				ending = c.namespaceEnding(ctx, ns)
				namespaces[ns] = ending
			}
			return ending
		}
		for _, n := range nodes {
			pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
			if err != nil {
				return false, fmt.Errorf("list the pods on node %s: %w", n.Name, err)
			}
			for _, p := range pods.Items {
				if p.Spec.RuntimeClassName == nil || *p.Spec.RuntimeClassName != ociruntime.HandlerName || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
					continue
				}
				if p.DeletionTimestamp != nil || nsEnding(p.Namespace) {
					ending = append(ending, p.Namespace+"/"+p.Name)
				} else {
					running = append(running, p.Namespace+"/"+p.Name+" on "+n.Name)
				}
			}
		}
		if len(running) > 0 {
			return false, fmt.Errorf("%d pods run under RuntimeClass %s (%s): migrate or delete them, then uninstall", len(running), ociruntime.HandlerName, strings.Join(running, ", "))
		}
		if len(ending) > 0 && !said {
			fmt.Fprintf(c.Progress, "waiting for %d pods under RuntimeClass %s to end (%s)\n", len(ending), ociruntime.HandlerName, strings.Join(ending, ", "))
			said = true
		}
		return len(ending) == 0, nil
	})
	if err != nil && len(running) == 0 && len(ending) > 0 {
		return fmt.Errorf("pods under RuntimeClass %s did not end within 3 minutes (%s): uninstall once they are gone", ociruntime.HandlerName, strings.Join(ending, ", "))
	}
	return err
}

// namespaceEnding says whether namespace is being deleted (its pods go
// soon, though none may be marked yet).
func (c Cluster) namespaceEnding(ctx context.Context, namespace string) bool {
	ns, err := c.Client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	return err == nil && ns.DeletionTimestamp != nil
}

// label sets or removes the label saying the runtime is installed on node.
func (c Cluster) label(ctx context.Context, node string, installed bool) error {
	value := `null`
	if installed {
		value = `"installed"`
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, ociruntime.NodeLabel, value)
	if _, err := c.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label node %s: %w", node, err)
	}
	return nil
}
