package plugin

import (
	"context"

	"github.com/google/go-containerregistry/pkg/authn"
	k8sauthn "github.com/google/go-containerregistry/pkg/authn/kubernetes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/broker"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kubelet"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// realDeps wires the engine to the cluster, the broker and the registry;
// pullSecrets are the migrated pod's.
func realDeps(ctx context.Context, client kubernetes.Interface, c migrate.Config, pullSecrets []corev1.LocalObjectReference) (migrate.Deps, error) {
	rest := client.CoreV1().RESTClient()
	return migrate.Deps{
		Client:  client,
		Kubelet: kubelet.Client{REST: rest},
		Packer: agent.Launcher{
			Client:         client,
			Image:          c.AgentImage,
			Namespace:      c.Agents(),
			AppNamespace:   c.Namespace,
			ID:             c.ID,
			RegistrySecret: c.RegistrySecret,
			PullSecrets:    pullSecrets,
			Labels:         map[string]string{"app.kubernetes.io/name": "kubectl-migrate-agent", migrate.MigrationLabel: c.ID},
			Serving:        &agent.Serving{},
		},
		DialBroker: func(ctx context.Context, url string) (migrate.Broker, error) { return broker.Dial(ctx, url) },
		App:        appctl.Client{REST: rest},
		Registry:   image.Registry{Keychain: keychain(ctx, client, c, pullSecrets), Insecure: c.InsecureRegistry},
		Records:    report.Store{Client: client},
		JournalKey: migrate.JournalKeyIn(client, c.Agents()),
	}, nil
}

// keychain finds registry credentials the way the nodes do (the registry
// secret and the pod's pull secrets) and then in the user's docker config.
func keychain(ctx context.Context, client kubernetes.Interface, c migrate.Config, pullSecrets []corev1.LocalObjectReference) authn.Keychain {
	var names []string
	if c.RegistrySecret != "" {
		names = append(names, c.RegistrySecret)
	}
	for _, s := range pullSecrets {
		names = append(names, s.Name)
	}
	if len(names) == 0 {
		return authn.DefaultKeychain
	}
	kc, err := k8sauthn.New(ctx, client, k8sauthn.Options{Namespace: c.Namespace, ImagePullSecrets: names})
	if err != nil {
		// Reading secrets may be forbidden; the user's own config may still do.
		return authn.DefaultKeychain
	}
	return authn.NewMultiKeychain(kc, authn.DefaultKeychain)
}
