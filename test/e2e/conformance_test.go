//go:build e2e

package e2e

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// conformance runs kubectl migrate conformance on an image of the lab,
// ending with a live migration from node-a to node-b, and returns its
// output and exit code.
func (l *lab) conformance(t *testing.T, image string, args ...string) (string, int) {
	t.Helper()
	argv := append([]string{"migrate", "conformance", "--image", l.imagePrefix + "/" + image + ":lab",
		"--broker-url", l.brokerURL, "--from", "node-a", "--to", "node-b", "--registry", l.registry + "/checkpoints",
		"--insecure-registry", "--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab"}, args...)
	var out bytes.Buffer
	cmd := l.kubectlCommand(argv...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("kubectl %s:\n%s", strings.Join(argv, " "), out.String())
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), 0
}

// TestConformanceOfTheLabsApplications: the Go sample, the Go inventory
// example and the Python consumer each keep every clause, the live
// migration included, and leave nothing behind.
func TestConformanceOfTheLabsApplications(t *testing.T) {
	concurrent(t)
	l := setup(t)
	for _, app := range []struct {
		name, image string
		args        []string
	}{
		{"go-sample", "ms2m-consumer", nil},
		{"go-inventory", "inventory", []string{"--arg", "consume", "--message", `{"sku":"sku-01","delta":1}`}},
		{"python", "python-consumer", nil},
	} {
		t.Run(app.name, func(t *testing.T) {
			t.Parallel()
			out, code := l.conformance(t, app.image, app.args...)
			if code != 0 || strings.Contains(out, "✗") || !strings.Contains(out, "✓ migrates live by checkpoint and restore") {
				t.Fatalf("exit %d; want every clause kept, the migration included", code)
			}
			l.scratchGone(t, out)
		})
	}
}

// TestConformanceCatchesAConsumerThatIgnoresSTOP: a consumer that answers
// STOP and goes on consuming fails that clause, and the check exits 6.
func TestConformanceCatchesAConsumerThatIgnoresSTOP(t *testing.T) {
	concurrent(t)
	l := setup(t)
	out, code := l.conformance(t, "python-consumer", "--arg=--broken=ignore-stop")
	if code != 6 || !strings.Contains(out, "✗ STOP leaves nothing consumed") || !strings.Contains(out, "✓ parks a message without identity") {
		t.Fatalf("exit %d; want 6 with the STOP clause failed after the ones before it passed", code)
	}
	l.scratchGone(t, out)
}

// scratchGone checks that the namespace the check named is gone or going.
func (l *lab) scratchGone(t *testing.T, out string) {
	t.Helper()
	i := strings.Index(out, "in namespace ms2m-conformance-")
	if i < 0 {
		t.Fatal("the check did not name its namespace")
	}
	ns := strings.Fields(out[i+len("in namespace "):])[0]
	got, err := l.client.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{})
	if err == nil && got.DeletionTimestamp == nil {
		t.Fatalf("namespace %s left behind", ns)
	}
}
