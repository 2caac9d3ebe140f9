package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/conformance"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

// TestExampleManifestsMatchTheRelease: the manifests in examples/manifests
// decode as Kubernetes objects, run images the release publishes, tell the
// applications their topology by the contract's variables, and give each
// consumer the annotations kubectl migrate reads.
func TestExampleManifestsMatchTheRelease(t *testing.T) {
	root := filepath.Join("..", "..")
	release, err := os.ReadFile(filepath.Join(root, ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "examples", "manifests", "*.yaml"))
	if len(files) < 3 {
		t.Fatalf("%d manifests in examples/manifests", len(files))
	}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var meta map[string]string
		var spec corev1.PodSpec
		switch o := obj.(type) {
		case *corev1.Pod:
			meta, spec = o.Annotations, o.Spec
		case *appsv1.StatefulSet:
			meta, spec = o.Spec.Template.Annotations, o.Spec.Template.Spec
		default:
			t.Fatalf("%s: a %T", file, obj)
		}
		c := spec.Containers[0]
		repo, _, _ := strings.Cut(c.Image, ":")
		if !strings.Contains(string(release), "repositories: ["+repo+"]") {
			t.Errorf("%s runs %s, which the release does not publish", file, c.Image)
		}
		env := map[string]bool{}
		for _, e := range c.Env {
			env[e.Name] = true
		}
		if !env[conformance.EnvBrokerURL] || !env[conformance.EnvExchange] {
			t.Errorf("%s does not tell the application its broker and exchange (%s, %s)", file, conformance.EnvBrokerURL, conformance.EnvExchange)
		}
		if strings.Contains(c.Image, "consumer") {
			for _, a := range []string{migrate.BrokerURLAnnotation, migrate.ExchangeAnnotation, migrate.QueueAnnotation, migrate.RegistryAnnotation} {
				if meta[a] == "" {
					t.Errorf("%s: the consumer lacks the %s annotation", file, a)
				}
			}
		}
	}
}
