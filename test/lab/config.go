package main

import (
	"os"
	"path/filepath"
)

// Version pins, all in one place.
const (
	kubernetesVersion = "1.34.4" // test/lab/k8s/go.mod pins the same
	etcdVersion       = "3.6.6"  // test/lab/etcd/go.mod pins the same
	crioVersion       = "1.34.0"
	containerdVersion = "2.3.7" // test/lab/containerd/go.mod pins the same
	// containerd24Version is the containerd-2.4 lane's (test/lab/containerd24/go.mod).
	containerd24Version = "2.4.2"
)

// Lab addresses. Everything lives in network namespaces the lab creates, on
// TEST-NET-2; the host reaches them over one veth pair. (Not TEST-NET-3:
// machines here resolve their package registries into 203.0.113.0/24, and
// routing that into the lab cut them off. up checks for such collisions.)
const (
	labNetns   = "klab"
	bridgeName = "klab-br0"
	labIP      = "198.51.100.1" // control plane, registry and broker
	hostIP     = "198.51.100.254"
	prefixLen  = "24"
	labSubnet  = "198.51.100.0/24"
	apiPort    = "6443"
	registry   = labIP + ":5000"
	// privateRegistry serves only with privateRegistryUser's credentials
	// (password the same): checkpoints a tenant must not pull.
	privateRegistry     = labIP + ":5001"
	privateRegistryUser = "e2e"
	amqpPort            = "5672"
	// serviceCIDR is required by the apiserver; nothing routes it (no kube-proxy).
	serviceCIDR = "10.96.0.0/24"
)

// labNode is one node's identity and addresses.
type labNode struct {
	Name    string
	IP      string
	PodCIDR string
	Gateway string // first address of PodCIDR, the CNI bridge
}

var nodes = []labNode{
	{Name: "node-a", IP: "198.51.100.11", PodCIDR: "10.88.1.0/24", Gateway: "10.88.1.1"},
	{Name: "node-b", IP: "198.51.100.12", PodCIDR: "10.88.2.0/24", Gateway: "10.88.2.1"},
}

func (n labNode) netns() string { return "klab-" + n.Name }

// dirs are the lab's places on disk: cache survives down/up, run does not.
type dirs struct {
	cache string
	run   string
}

func labDirs() dirs {
	cache := os.Getenv("LAB_CACHE")
	if cache == "" {
		cache = "/var/cache/kubectl-migrate-lab"
	}
	return dirs{cache: cache, run: filepath.Join(cache, "run")}
}

func (d dirs) bin(name string) string   { return filepath.Join(d.cache, "bin", name) }
func (d dirs) pythonBase() string       { return filepath.Join(d.cache, "python-trixie.tar.gz") }
func (d dirs) rootfs() string           { return filepath.Join(d.cache, "rootfs") }
func (d dirs) pki(name string) string   { return filepath.Join(d.run, "pki", name) }
func (d dirs) log(name string) string   { return filepath.Join(d.run, "logs", name+".log") }
func (d dirs) pid(name string) string   { return filepath.Join(d.run, "pids", name+".pid") }
func (d dirs) node(n labNode) string    { return filepath.Join(d.run, n.Name) }
func (d dirs) kubeconfig() string       { return filepath.Join(d.run, "admin.kubeconfig") }
func (d dirs) state(name string) string { return filepath.Join(d.run, name) }
