package nodesetup

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// node is a node's files under a temporary root and a runtime whose
// handlers are those of the drop-ins present at its last restart.
type node struct {
	root     string
	restarts int
	handlers []string
}

func newNode(t *testing.T, files map[string]string) *node {
	t.Helper()
	n := &node{root: t.TempDir(), handlers: []string{"runc"}}
	for path, content := range files {
		full := filepath.Join(n.root, path)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func (n *node) options(t *testing.T, runtime string, uninstall bool) Options {
	self := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(self, []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return Options{
		Runtime: runtime, Uninstall: uninstall, Root: n.root, Self: self, Timeout: time.Second,
		Handlers: func(context.Context) ([]string, error) { return n.handlers, nil },
		restartHook: func(context.Context) error {
			n.restarts++
			n.handlers = []string{"runc"}
			for _, f := range []string{containerdFile, crioFile} {
				if b, err := os.ReadFile(filepath.Join(n.root, f)); err == nil && strings.Contains(string(b), "."+ociruntime.HandlerName+"]") {
					n.handlers = append(n.handlers, ociruntime.HandlerName)
				}
			}
			return nil
		},
	}
}

func (n *node) read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (n *node) gone(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(n.root, p)); !os.IsNotExist(err) {
			t.Errorf("%s is left: %v", p, err)
		}
	}
}

const containerdV3 = `version = 3
imports = ["/etc/containerd/conf.d/*.toml"]
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    privileged_without_host_devices = true
    base_runtime_spec = "/etc/containerd/hardened-spec.json"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "/usr/local/sbin/runc"
      SystemdCgroup = true
      NoNewKeyring = true
`

func TestInstallAndUninstallOnContainerd(t *testing.T) {
	n := newNode(t, map[string]string{"/etc/containerd/config.toml": containerdV3})
	ctx := context.Background()
	msg, err := Run(ctx, n.options(t, Containerd, false))
	if err != nil {
		t.Fatal(err)
	}
	dropIn := n.read(t, containerdFile)
	for _, want := range []string{`version = 3`, `[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.kubectl-migrate]`, `runtime_type = "io.containerd.runc.v2"`, `BinaryName = "/opt/kubectl-migrate/bin/kubectl-migrate-runtime"`, `SystemdCgroup = true`,
		// The default handler's hardening goes with it.
		`privileged_without_host_devices = true`, `base_runtime_spec = "/etc/containerd/hardened-spec.json"`, `NoNewKeyring = true`} {
		if !strings.Contains(dropIn, want) {
			t.Errorf("drop-in lacks %s:\n%s", want, dropIn)
		}
	}
	if got := n.read(t, ociruntime.ConfigFile); !strings.Contains(got, `"runc":"/usr/local/sbin/runc"`) || !strings.Contains(got, `"cri":"containerd"`) {
		t.Errorf("runtime.json %s: not the default handler's runc and containerd", got)
	}
	if info, err := os.Stat(filepath.Join(n.root, BinDir, ociruntime.BinaryName)); err != nil || info.Mode().Perm() != 0o755 {
		t.Fatalf("binary: %v %v", info, err)
	}
	if n.restarts != 1 || !strings.Contains(msg, "lists handler kubectl-migrate") {
		t.Fatalf("restarts %d, %q", n.restarts, msg)
	}
	if _, err := Run(ctx, n.options(t, Containerd, true)); err != nil {
		t.Fatal(err)
	}
	n.gone(t, containerdFile, filepath.Join(BinDir, ociruntime.BinaryName), ociruntime.ConfigFile, Dir, filepath.Dir(containerdFile))
	if n.restarts != 2 || slices.Contains(n.handlers, ociruntime.HandlerName) {
		t.Fatalf("after uninstall: restarts %d, handlers %v", n.restarts, n.handlers)
	}
	if got := n.read(t, "/etc/containerd/config.toml"); got != containerdV3 {
		t.Fatalf("containerd's own configuration changed:\n%s", got)
	}
}

func TestContainerdWithoutDropInsIsRefusedUntouched(t *testing.T) {
	config := strings.Replace(containerdV3, `imports = ["/etc/containerd/conf.d/*.toml"]`, "", 1)
	n := newNode(t, map[string]string{"/etc/containerd/config.toml": config})
	_, err := Run(context.Background(), n.options(t, Containerd, false))
	if err == nil || !strings.Contains(err.Error(), `add imports = ["/etc/containerd/conf.d/*.toml"]`) {
		t.Fatalf("err %v", err)
	}
	n.gone(t, containerdFile, ociruntime.ConfigFile, filepath.Join(BinDir, ociruntime.BinaryName))
	if n.restarts != 0 {
		t.Fatal("restarted a runtime it configured nothing for")
	}
}

func TestInstallOnCRIO(t *testing.T) {
	n := newNode(t, map[string]string{
		"/etc/crio/crio.conf.d/10-site.conf": "[crio.runtime]\ndefault_runtime = \"runc\"\n[crio.runtime.runtimes.runc]\nruntime_path = \"/opt/bin/runc\"\nruntime_type = \"oci\"\nmonitor_path = \"/usr/bin/conmon\"\nmonitor_cgroup = \"pod\"\nallowed_annotations = [\"io.kubernetes.cri-o.Devices\"]\n",
	})
	if _, err := Run(context.Background(), n.options(t, CRIO, false)); err != nil {
		t.Fatal(err)
	}
	dropIn := n.read(t, crioFile)
	for _, want := range []string{"[crio.runtime.runtimes.kubectl-migrate]", `runtime_path = "/opt/kubectl-migrate/bin/kubectl-migrate-runtime"`, `monitor_path = "/usr/bin/conmon"`, `monitor_cgroup = "pod"`, `allowed_annotations = ["io.kubernetes.cri-o.Devices"]`} {
		if !strings.Contains(dropIn, want) {
			t.Errorf("drop-in lacks %s:\n%s", want, dropIn)
		}
	}
	if got := n.read(t, ociruntime.ConfigFile); !strings.Contains(got, `"runc":"/opt/bin/runc"`) || !strings.Contains(got, `"cri":"cri-o"`) {
		t.Errorf("runtime.json %s: not the default handler's runc and CRI-O", got)
	}
}

func TestARuntimeThatNeverListsTheHandlerFails(t *testing.T) {
	n := newNode(t, map[string]string{"/etc/containerd/config.toml": containerdV3})
	o := n.options(t, Containerd, false)
	o.restartHook = func(context.Context) error { n.restarts++; return nil } // loads nothing
	_, err := Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "never lists handler kubectl-migrate") {
		t.Fatalf("err %v", err)
	}
}
