package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
)

// A nodeRuntime is the container runtime the lab's nodes run: CRI-O (the
// default) or containerd, chosen with LAB_RUNTIME when the lab comes up and
// remembered until it goes down.
type nodeRuntime struct {
	name    string // LAB_RUNTIME's value, and the daemon's suffix
	kind    string // crio or containerd
	version string // containerd's release
	socket  string // the CRI socket inside the node
	storage string // where its container storage lives (a bind mount: overlayfs cannot host overlay storage)
}

var runtimes = map[string]nodeRuntime{
	"crio":       {name: "crio", kind: "crio", socket: "/run/crio/crio.sock", storage: "/var/lib/containers"},
	"containerd": {name: "containerd", kind: "containerd", version: containerdVersion, socket: "/run/containerd/containerd.sock", storage: "/var/lib/containerd"},
	// The release without CRI restore: migrations restore through the
	// kubectl-migrate runtime (node-setup) or are refused.
	"containerd-2.4": {name: "containerd-2.4", kind: "containerd", version: containerd24Version, socket: "/run/containerd/containerd.sock", storage: "/var/lib/containerd"},
}

// binDir is where a runtime's binaries are inside a node: containerd 2.4's
// beside 2.3's, each with its own shim.
func (rt nodeRuntime) binDir() string {
	if rt.name == "containerd-2.4" {
		return "/opt/lab/bin/containerd-" + rt.version
	}
	return "/opt/lab/bin"
}

// runtime is the lab's runtime: the one it came up with while it is up,
// otherwise the one LAB_RUNTIME asks for.
func (d dirs) runtime() (nodeRuntime, error) {
	name := strings.TrimSpace(os.Getenv("LAB_RUNTIME"))
	if b, err := os.ReadFile(d.state("runtime")); err == nil {
		up := strings.TrimSpace(string(b))
		if name != "" && name != up {
			return nodeRuntime{}, fmt.Errorf("the lab is up with %s, not %s: go run ./test/lab down first", up, name)
		}
		name = up
	}
	return runtimeNamed(name)
}

// runtimeNamed is LAB_RUNTIME's lane; CRI-O's if name is empty.
func runtimeNamed(name string) (nodeRuntime, error) {
	name = strings.TrimSpace(name)
	if name == "" {
		name = "crio"
	}
	rt, ok := runtimes[name]
	if !ok {
		return nodeRuntime{}, fmt.Errorf("LAB_RUNTIME=%s: use crio, containerd or containerd-2.4", name)
	}
	return rt, nil
}

// daemon is the name of a node's runtime process.
func (rt nodeRuntime) daemon(n labNode) string { return n.Name + "-" + rt.name }

// argv starts the runtime inside a node.
func (rt nodeRuntime) argv() []string {
	if rt.kind == "containerd" {
		return []string{rt.binDir() + "/containerd", "--config", "/etc/containerd/config.toml"}
	}
	return []string{"/opt/lab/bin/crio", "--log-level", "info"}
}

// superviseRuntime runs a runtime as systemd's Restart=always would: it
// starts the runtime again whenever it exits (kubectl migrate node-setup
// --restart signal stops it to load a new handler), and stops it when
// stopped itself.
const superviseRuntime = `trap 'kill -TERM $child 2>/dev/null; wait $child; exit 0' TERM INT
while :; do "$@" & child=$!; wait $child; sleep 1; done`

// startRuntime starts a node's runtime, supervised, and waits for its
// socket.
func (d dirs) startRuntime(rt nodeRuntime, n labNode, env []string) error {
	argv := append([]string{"/bin/sh", "-c", superviseRuntime, "supervise"}, rt.argv()...)
	if rt.binDir() != "/opt/lab/bin" {
		env = append(slices.Clone(env), "PATH="+rt.binDir()+":"+strings.TrimPrefix(nodePath, "PATH=")) // its own shim first
	}
	if err := d.start(rt.daemon(n), d.inNode(n, argv...), env); err != nil {
		return err
	}
	return waitFor(n.Name+" "+rt.name+" socket", time.Minute, func() error {
		_, err := os.Stat(filepath.Join("/proc", d.pidOf(rt.daemon(n)), "root", rt.socket))
		return err
	})
}

// runtimeFiles configure the runtime. restore says whether a runtime
// whose restore is opt-in has it on (containerd 2.2.7+/2.3.4+:
// enable_experimental_restore_via_create).
func (rt nodeRuntime) files(n labNode, restore bool) map[string]string {
	if rt.kind == "crio" {
		return map[string]string{"/etc/crio/crio.conf.d/10-lab.conf": crioConfig()}
	}
	files := map[string]string{"/etc/containerd/config.toml": containerdConfig(restore)}
	// Plain-HTTP registries: the lab's, and a warm agent's (--transfer direct).
	for _, host := range []string{registry, privateRegistry, agent.DirectRegistry()} {
		files["/etc/containerd/certs.d/"+host+"/hosts.toml"] = fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n", host, host)
	}
	return files
}

func crioConfig() string {
	return fmt.Sprintf(`[crio]
log_dir = "/var/log/crio/pods"
[crio.api]
listen = "/var/run/crio/crio.sock"
[crio.runtime]
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
default_runtime = "runc"
enable_criu_support = true
pinns_path = "/opt/lab/bin/pinns"
[crio.runtime.runtimes.runc]
runtime_path = "/opt/lab/bin/runc-wrapper"
runtime_type = "oci"
monitor_path = "/usr/bin/conmon"
allowed_annotations = ["org.criu.config"]
[crio.image]
pause_image = "%s/kubectl-migrate/pause:lab"
pause_command = "/usr/local/bin/pause"
# localhost: a warm agent's registry, for transfers without one (--transfer direct)
insecure_registries = ["%s", "%s", "localhost:%d"]
[crio.network]
network_dir = "/etc/cni/net.d"
plugin_dirs = ["/usr/lib/cni"]
`, registry, registry, privateRegistry, agent.DirectPort)
}

// containerdConfig is containerd's config: its defaults but for what this
// machine needs (no CAP_SYS_RESOURCE: restrict_oom_score_adj; hugetlb on
// cgroup v2 beside a v1 hierarchy: no hugetlb controller; cgroupfs) and the
// lab's pause image, registries and runc wrapper.
func containerdConfig(restore bool) string {
	return fmt.Sprintf(`version = 3
# As containerd's default configuration: node-setup's drop-in goes here.
imports = ["/etc/containerd/conf.d/*.toml"]
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "%s/kubectl-migrate/pause:lab"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "/etc/containerd/certs.d"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  enable_criu = true
  # Restore through CreateContainer is opt-in since containerd 2.2.7/2.3.4.
  enable_experimental_restore_via_create = %t
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/opt/lab/bin/runc-wrapper"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "/etc/cni/net.d"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`, registry, restore)
}

// setRestore turns a containerd node's restore opt-in on or off and
// restarts its containerd (running containers keep running: their shims do
// not depend on it). It proves preflight's and check's answers for a node
// left at the default.
func (d dirs) setRestore(nodeName, value string) error {
	rt, err := d.runtime()
	if err != nil {
		return err
	}
	if rt.name != "containerd" {
		if rt.kind == "containerd" {
			return fmt.Errorf("containerd %s has no restore to opt into; bring the lab up with LAB_RUNTIME=containerd (%s)", rt.version, containerdVersion)
		}
		return fmt.Errorf("the lab's CRI-O %s has no restore opt-in (its [crio.checkpoint_restore] came in later patch releases); bring the lab up with LAB_RUNTIME=containerd", crioVersion)
	}
	if value != "on" && value != "off" {
		return fmt.Errorf("restore %s %s: say on or off", nodeName, value)
	}
	var node *labNode
	for i := range nodes {
		if nodes[i].Name == nodeName {
			node = &nodes[i]
		}
	}
	if node == nil {
		return fmt.Errorf("no node %q; the lab's are %s and %s", nodeName, nodes[0].Name, nodes[1].Name)
	}
	if err := writeFiles(filepath.Join(d.node(*node), "upper"), rt.files(*node, value == "on")); err != nil {
		return err
	}
	if err := d.stop(rt.daemon(*node), 20*time.Second); err != nil {
		return err
	}
	if err := d.startRuntime(rt, *node, nodeEnv); err != nil {
		return err
	}
	// The kubelet reports the runtime's version as "Unknown" until it has
	// reconnected, and a status posted before the restart still shows the
	// old version: done once a status whose heartbeat came a second after
	// the runtime was back (the kubelet asks for the version just before
	// it stamps the heartbeat) shows the version and Ready.
	up := time.Now().Add(time.Second)
	client, err := d.adminClient()
	if err != nil {
		return err
	}
	want := "containerd://" + rt.version
	return waitFor(nodeName+" reporting "+want+" after the restart", time.Minute, func() error {
		n, err := client.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := n.Status.NodeInfo.ContainerRuntimeVersion; got != want {
			return fmt.Errorf("it reports %s", got)
		}
		for _, c := range n.Status.Conditions {
			if c.Type != corev1.NodeReady {
				continue
			}
			if c.LastHeartbeatTime.Time.Before(up) {
				return fmt.Errorf("its last status is from %s, before the restart", c.LastHeartbeatTime.Format(time.RFC3339))
			}
			if c.Status != corev1.ConditionTrue {
				return fmt.Errorf("it is not Ready: %s", c.Message)
			}
			return nil
		}
		return errors.New("it reports no Ready condition")
	})
}
