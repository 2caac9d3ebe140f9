package migrate

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Uncheckpointable says why pod's process cannot be moved by a checkpoint,
// whatever the strategy, or "" if nothing in its spec stops it: what ties
// the process to its node, or holds state CRIU cannot dump, has to stay. A
// drain skips such a pod with this reason; preflight refuses it with it.
// (hostPath volumes and node-local claims are checkVolumes'.)
func Uncheckpointable(pod *corev1.Pod) string {
	switch {
	case pod.Spec.HostNetwork:
		return "it runs on the node's network (hostNetwork): its sockets and address are the node's, and no other node can take them"
	case pod.Spec.HostPID:
		return "it shares the node's process IDs (hostPID): a checkpoint would take the node's processes, which no other node has"
	case pod.Spec.HostIPC:
		return "it shares the node's IPC namespace (hostIPC): its shared memory and semaphores are the node's"
	}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, res := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for name := range res {
				if device(name) {
					return fmt.Sprintf("container %s uses the device %s: CRIU cannot checkpoint a device's state (a GPU's memory, say), so the process would lose it", c.Name, name)
				}
			}
		}
	}
	return ""
}

// device tells whether a resource is a device a plugin hands out: an
// extended resource, whose name has a domain (nvidia.com/gpu). The node's
// CPU, memory, storage and huge pages have none; a checkpoint carries them
// or a target provides them afresh.
func device(name corev1.ResourceName) bool {
	return strings.Contains(string(name), "/")
}
