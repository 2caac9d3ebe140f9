package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/plugin"
)

// kubectl returns the kubectl to test with: MIGRATE_TEST_KUBECTL (the Makefile
// builds one from the module proxy), else the one on PATH.
func kubectl(t *testing.T) string {
	if k := os.Getenv("MIGRATE_TEST_KUBECTL"); k != "" {
		return k
	}
	k, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no kubectl: CI must build one (make test does)")
		}
		t.Skip("no kubectl on PATH; make test builds one")
	}
	return k
}

type result struct {
	stdout, stderr string
	exitCode       int
}

func TestRealKubectlRunsThePlugin(t *testing.T) {
	k := kubectl(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(bin, "kubectl-migrate"), "github.com/kubectl-migrate/kubectl-migrate/cmd/kubectl-migrate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// An empty kubeconfig: nothing here may reach a cluster.
	kubeconfig := filepath.Join(t.TempDir(), "config")
	run := func(args ...string) result {
		cmd := exec.Command(k, args...)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig, "NO_COLOR=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return result{stdout.String(), stderr.String(), code}
	}

	if r := run("plugin", "list"); !strings.Contains(r.stdout, filepath.Join(bin, "kubectl-migrate")) {
		t.Fatalf("kubectl plugin list does not see the plugin:\n%s%s", r.stdout, r.stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "pod", "--help"}, "kubectl migrate pod NAME --to NODE [flags]"},
		{[]string{"migrate", "report", "--help"}, "kubectl migrate report [ID] [flags]"},
		{[]string{"migrate", "--help"}, "kubectl migrate [command]"},
		{[]string{"migrate", "version"}, "kubectl-migrate dev"},
	} {
		r := run(tc.args...)
		if r.exitCode != 0 || !strings.Contains(r.stdout, tc.want) {
			t.Errorf("kubectl %s: exit %d, stdout lacks %q:\n%s%s", strings.Join(tc.args, " "), r.exitCode, tc.want, r.stdout, r.stderr)
		}
	}
	// Bad input: one line naming the fix and pointing at the help, and the
	// usage exit code, through the real kubectl and the built binary.
	r := run("migrate", "pod", "consumer")
	if r.exitCode != plugin.ExitUsage || r.stderr != "error: --to NODE is required: the node to move pod consumer to (see 'kubectl migrate pod --help')\n" {
		t.Fatalf("bad input: exit %d, stderr %q", r.exitCode, r.stderr)
	}
	r = run("migrate", "pod", "consumer", "--to", "node-b", "--no-such-flag")
	if r.exitCode != plugin.ExitUsage || !strings.Contains(r.stderr, "unknown flag: --no-such-flag (see 'kubectl migrate pod --help')") {
		t.Fatalf("unknown flag: exit %d, stderr %q", r.exitCode, r.stderr)
	}
}
