package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
)

// nodeFiles are written into a node's overlay upper directory before its
// root is mounted, so they appear in the node's /etc.
func nodeFiles(d dirs, n labNode) (map[string]string, error) {
	ca, err := os.ReadFile(d.pki("ca.crt"))
	if err != nil {
		return nil, err
	}
	kubeconfig, err := os.ReadFile(d.state(n.Name + ".kubeconfig"))
	if err != nil {
		return nil, err
	}
	return map[string]string{
		"/etc/crio/crio.conf.d/10-lab.conf": fmt.Sprintf(`[crio]
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
insecure_registries = ["%s", "localhost:%d"]
[crio.network]
network_dir = "/etc/cni/net.d"
plugin_dirs = ["/usr/lib/cni"]
`, registry, registry, agent.DirectPort),
		"/etc/containers/policy.json": `{"default":[{"type":"insecureAcceptAnything"}]}` + "\n",
		"/etc/cni/net.d/10-klab.conflist": fmt.Sprintf(`{"cniVersion":"1.0.0","name":"klab","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":false,"hairpinMode":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"%s","gateway":"%s"}]],"routes":[{"dst":"0.0.0.0/0"}]}}]}
`, n.PodCIDR, n.Gateway),
		// Established TCP connections are closed at dump and restore: the
		// restored pod has another IP, so its broker connection could not
		// be restored anyway; the application reconnects.
		"/etc/criu/runc.conf":                "tcp-close\n",
		"/etc/kubernetes/pki/ca.crt":         string(ca),
		"/etc/kubernetes/kubelet.kubeconfig": string(kubeconfig),
		"/etc/kubernetes/kubelet.yaml": fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /klab-%s
containerRuntimeEndpoint: unix:///var/run/crio/crio.sock
address: %s
port: 10250
readOnlyPort: 0
authentication:
  anonymous:
    enabled: false
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
failSwapOn: false
failCgroupV1: false
oomScoreAdj: 0
resolvConf: /etc/resolv.conf
localStorageCapacityIsolation: false
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
featureGates:
  ContainerCheckpoint: true
`, n.Name, n.IP),
		"/etc/resolv.conf": "nameserver 127.0.0.1\n",
		"/etc/hostname":    n.Name + "\n",
	}, nil
}

func writeFiles(root string, files map[string]string) error {
	for path, content := range files {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}
