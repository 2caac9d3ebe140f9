package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
)

// nodeFiles are written into a node's overlay upper directory before its
// root is mounted, so they appear in the node's /etc.
func nodeFiles(d dirs, n labNode, rt nodeRuntime) (map[string]string, error) {
	ca, err := os.ReadFile(d.pki("ca.crt"))
	if err != nil {
		return nil, err
	}
	kubeconfig, err := os.ReadFile(d.state(n.Name + ".kubeconfig"))
	if err != nil {
		return nil, err
	}
	files := map[string]string{
		"/etc/containers/policy.json": `{"default":[{"type":"insecureAcceptAnything"}]}` + "\n",
		"/etc/cni/net.d/10-klab.conflist": fmt.Sprintf(`{"cniVersion":"1.0.0","name":"klab","plugins":[{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":false,"hairpinMode":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"%s","gateway":"%s"}]],"routes":[{"dst":"0.0.0.0/0"}]}}]}
`, n.PodCIDR, n.Gateway),
		// Established TCP connections are closed at dump and restore: the
		// restored pod has another IP, so its broker connection could not
		// be restored anyway; the application reconnects. A connection not
		// yet accepted (a probe that came while the container was frozen)
		// is left out of the dump instead of failing it.
		"/etc/criu/runc.conf":                "tcp-close\nskip-in-flight\n",
		"/etc/kubernetes/pki/ca.crt":         string(ca),
		"/etc/kubernetes/kubelet.kubeconfig": string(kubeconfig),
		"/etc/kubernetes/kubelet.yaml": fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /klab-%s
containerRuntimeEndpoint: unix://%s
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
# The host's disk is shared with builds: the kubelet neither evicts nor
# collects images (a CRI-O restore needs the checkpointed container's base
# image, which image GC frees while nothing on the node runs it).
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# The node's status is posted every 4 s, changed or not, so a wait after a
# runtime restart can tell a fresh status (heartbeat after the restart)
# from the one posted before it.
nodeStatusUpdateFrequency: 4s
nodeStatusReportFrequency: 4s
# KubeletEnsureSecretPulledImages (KEP-2535, on by default from 1.35): a
# pod may use an image pulled with credentials only with those credentials,
# so another namespace's pod cannot run a checkpoint image left on a node.
featureGates:
  ContainerCheckpoint: true
  KubeletEnsureSecretPulledImages: true
`, n.Name, rt.socket, n.IP),
		"/etc/resolv.conf": "nameserver 127.0.0.1\n",
		"/etc/hostname":    n.Name + "\n",
	}
	// The lab's nodes restore: an opt-in is on until a test turns it off.
	maps.Copy(files, rt.files(n, true))
	return files, nil
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
