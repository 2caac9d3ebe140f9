package plugin

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
)

// The broker's password comes from a Secret or the environment, so that
// neither a command line nor an annotation need carry it; what cannot be
// used is said with the fix, and no error shows a password.
func TestBrokerCredentials(t *testing.T) {
	secret := func(data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "rabbit-user", Namespace: "shop"}, Data: map[string][]byte{}}
		for k, v := range data {
			s.Data[k] = []byte(v)
		}
		return s
	}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		env     []string
		secret  string
		url     string
		want    string // the URL, or a part of the error
	}{
		{"the secret's user and password", []runtime.Object{secret(map[string]string{"username": "orders", "password": "s3cret"})}, nil, "rabbit-user", "amqp://rabbit.shop:5672/", "amqp://orders:s3cret@rabbit.shop:5672/"},
		{"the secret's password, the URL's user", []runtime.Object{secret(map[string]string{"password": "s3cret"})}, nil, "rabbit-user", "amqp://guest@rabbit.shop/", "amqp://guest:s3cret@rabbit.shop/"},
		{"the secret wins over the environment", []runtime.Object{secret(map[string]string{"password": "s3cret"})}, []string{brokerPasswordEnv + "=fromenv"}, "rabbit-user", "amqp://guest@rabbit.shop/", "amqp://guest:s3cret@rabbit.shop/"},
		{"the environment", nil, []string{"HOME=/root", brokerPasswordEnv + "=fromenv"}, "", "amqp://guest:old@rabbit.shop/", "amqp://guest:fromenv@rabbit.shop/"},
		{"neither: the URL as it is", nil, nil, "", "amqp://guest:pw@rabbit.shop/", "amqp://guest:pw@rabbit.shop/"},
		{"no such secret", nil, nil, "rabbit-user", "amqp://guest@rabbit.shop/", "broker secret rabbit-user not found in namespace shop: create it with the keys username and password, or pass another with --broker-secret"},
		{"no password in it", []runtime.Object{secret(map[string]string{"username": "orders"})}, nil, "rabbit-user", "amqp://rabbit.shop/", `broker secret rabbit-user in namespace shop has no "password" key`},
		{"no user to go with it", nil, []string{brokerPasswordEnv + "=fromenv"}, "", "amqp://rabbit.shop/", "names no user for the password to go with"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &RootOptions{Environ: tc.env}
			got, err := o.brokerCredentials(context.Background(), fake.NewClientset(tc.objects...), "shop", tc.secret, tc.url)
			if err != nil {
				got = err.Error()
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if err != nil && (strings.Contains(got, "s3cret") || strings.Contains(got, "fromenv")) {
				t.Fatalf("the error shows the password: %q", got)
			}
		})
	}

	forbidden := fake.NewClientset()
	forbidden.PrependReactor("get", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "rabbit-user", nil)
	})
	_, err := (&RootOptions{}).brokerCredentials(context.Background(), forbidden, "shop", "rabbit-user", "amqp://rabbit.shop/")
	if err == nil || !strings.Contains(err.Error(), "grant get on it (a Role with resourceNames: [rabbit-user]), or set "+brokerPasswordEnv) {
		t.Fatalf("forbidden: %v", err)
	}
}

// A dry run's plan shows the pod it would create, whose annotations are
// the source's: the broker's password is left out.
func TestDryRunPlanShowsNoBrokerPassword(t *testing.T) {
	source := migratetest.SourcePod()
	source.Annotations = map[string]string{migrate.BrokerURLAnnotation: "amqp://orders:s3cret@rabbit.shop/"}
	w := migratetest.NewWorld(t, migratetest.Node("node-a", "cri-o://1.34.0"), migratetest.Node("node-b", "cri-o://1.34.0"), source)
	r := execute(t, w, append([]string{"pod", "consumer", "--to", "node-b", "--dry-run", "-o", "yaml"}, brokerFlags...)...)
	if r.err != nil || !strings.Contains(r.out.String(), "rabbit.shop") || strings.Contains(r.out.String()+r.errOut.String(), "s3cret") {
		t.Fatalf("the plan: %v\n%s", r.err, r.out)
	}
}
