package migrate

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
)

// A checkpoint sent without a registry and restored by the container
// runtime is an image in the node's store, pulled from the node's agent.
// The agent serves it only with a read credential, which the restored pod
// presents in a pull secret of its own: the kubelet then remembers that
// the image came in with that secret, and a pod of another namespace that
// names it must pull it itself and is refused (KEP-2535's
// KubeletEnsureSecretPulledImages, on by default from Kubernetes 1.35).
// The secret belongs to the pod, so it lasts as long as the pod, whose
// restarts restore from the image again, and goes with it.

// pullSecretName names the pull secret of this stage's restore on node.
func (m *Migration) pullSecretName(node string) string {
	return "kubectl-migrate-pull-" + m.tag() + "-" + node
}

// PullSecret is the dockerconfigjson secret that lets the runtime of a pod's
// node read checkpoint images from its agent (agent.DirectRegistry), whose
// push token is token.
func PullSecret(namespace, name, migrationID, token string) (*corev1.Secret, error) {
	password := agent.PullPassword(token)
	config, err := json.Marshal(map[string]any{"auths": map[string]any{agent.DirectRegistry(): map[string]string{
		"username": agent.PullUser, "password": password,
		"auth": base64.StdEncoding.EncodeToString([]byte(agent.PullUser + ":" + password)),
	}}})
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{
			kube.ManagedByLabel: kube.ManagedBy, MigrationLabel: migrationID,
		}},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: config},
	}, nil
}

// writePullSecret writes the pull secret pod on node presents, with the
// read credential of node's receiver, and names it in pod. A recovery's
// receiver is a new agent with a new token, so an existing secret is
// overwritten.
func (m *Migration) writePullSecret(ctx context.Context, pod *corev1.Pod, node string) error {
	rcv, err := m.receiverOn(ctx, node)
	if err != nil {
		return err
	}
	secret, err := PullSecret(m.config.Namespace, m.pullSecretName(node), m.config.ID, rcv.Token)
	if err != nil {
		return err
	}
	_, err = m.deps.Client.CoreV1().Secrets(m.config.Namespace).Create(ctx, secret, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = m.deps.Client.CoreV1().Secrets(m.config.Namespace).Update(ctx, secret, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write the secret %s the restored pod pulls its checkpoint with: %w", secret.Name, err)
	}
	pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: secret.Name})
	return nil
}

// givePullSecret makes pod, created with the pull secret of its node, its
// owner: the secret goes when the pod does.
func (m *Migration) givePullSecret(ctx context.Context, pod *corev1.Pod) error {
	owners, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
	}}}})
	if err != nil {
		return err
	}
	name := m.pullSecretName(pod.Spec.NodeName)
	if _, err := m.deps.Client.CoreV1().Secrets(m.config.Namespace).Patch(ctx, name, types.MergePatchType, owners, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("give pod %s its pull secret %s: %w", pod.Name, name, err)
	}
	return nil
}

// removePullSecret deletes the pull secret of a restore on node that was
// undone (one whose pod exists goes with it).
func (m *Migration) removePullSecret(ctx context.Context, node string) error {
	name := m.pullSecretName(node)
	if err := kube.DeleteSecret(ctx, m.deps.Client, m.config.Namespace, name); err != nil {
		return fmt.Errorf("delete the pull secret %s: %w", name, err)
	}
	return nil
}
