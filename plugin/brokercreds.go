package plugin

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

// The broker's password, so that it need be neither on a command line (in
// the shell's history and every process listing) nor in a pod annotation
// (readable by whoever may read the pod): from an environment variable, or
// from a Secret of the pod's namespace (--broker-secret, or the pod's
// ms2m.io/broker-secret annotation) with the keys a RabbitMQ operator's
// default-user Secret has.
const (
	brokerPasswordEnv       = "KUBECTL_MIGRATE_BROKER_PASSWORD"
	brokerSecretUsernameKey = "username"
	brokerSecretPasswordKey = "password"
)

// brokerCredentials puts into rawURL the password (and user) from the
// first source that has it: secret (a Secret in namespace), else the
// environment; with neither, rawURL as it is.
func (o *RootOptions) brokerCredentials(ctx context.Context, client kubernetes.Interface, namespace, secret, rawURL string) (string, error) {
	if rawURL == "" {
		return "", nil // validation names what is missing
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL, nil // the dial says what is wrong with it
	}
	user := u.User.Username()
	var password string
	switch {
	case secret != "":
		s, err := client.CoreV1().Secrets(namespace).Get(ctx, secret, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return "", fmt.Errorf("broker secret %s not found in namespace %s: create it with the keys %s and %s, or pass another with --broker-secret", secret, namespace, brokerSecretUsernameKey, brokerSecretPasswordKey)
		case apierrors.IsForbidden(err):
			return "", fmt.Errorf("may not read broker secret %s in namespace %s: grant get on it (a Role with resourceNames: [%s]), or set %s instead", secret, namespace, secret, brokerPasswordEnv)
		case err != nil:
			return "", fmt.Errorf("read broker secret %s: %w", secret, err)
		}
		password = string(s.Data[brokerSecretPasswordKey])
		if password == "" {
			return "", fmt.Errorf("broker secret %s in namespace %s has no %q key", secret, namespace, brokerSecretPasswordKey)
		}
		if name := string(s.Data[brokerSecretUsernameKey]); name != "" {
			user = name
		}
	case o.getenv(brokerPasswordEnv) != "":
		password = o.getenv(brokerPasswordEnv)
	default:
		return rawURL, nil
	}
	if user == "" {
		return "", fmt.Errorf("the broker URL %s names no user for the password to go with: give one (amqp://USER@host/) or the Secret's %q key", u.Redacted(), brokerSecretUsernameKey)
	}
	u.User = url.UserPassword(user, password)
	return u.String(), nil
}

// getenv reads the environment the options were made with.
func (o *RootOptions) getenv(key string) string {
	for _, kv := range o.Environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// brokerSecretOf is the broker Secret a migration of pod uses: the flag's,
// else the pod's annotation's.
func brokerSecretOf(flag string, annotations map[string]string) string {
	if flag != "" {
		return flag
	}
	return annotations[migrate.BrokerSecretAnnotation]
}
