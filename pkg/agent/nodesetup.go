package agent

import (
	"context"
	"fmt"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/nodesetup"
)

// RuntimeHandlers lists the handlers the runtime at socket offers, from its
// CRI status.
func RuntimeHandlers(ctx context.Context, socket string) ([]string, error) {
	conn, err := dialRuntime(socket)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	st, err := criv1.NewRuntimeServiceClient(conn).Status(ctx, &criv1.StatusRequest{})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, h := range st.GetRuntimeHandlers() {
		names = append(names, h.GetName())
	}
	return names, nil
}

// NodeSetup runs node-setup (install, or uninstall with --uninstall among
// args) on node, whose runtime is runtime (nodesetup.Containerd or
// nodesetup.CRIO), and returns its one-line report. The pod sees the host's
// processes (to find the runtime it restarts) and mounts what node-setup
// writes or reads, creating nothing by mounting it (and it is root with
// SYS_PTRACE, not privileged): the runtime's configuration directory, /opt
// (for /opt/kubectl-migrate) and /run (the runtime's socket, systemd's).
func (l Launcher) NodeSetup(ctx context.Context, podName, node, runtime string, args []string) (string, error) {
	configDir := map[string]string{nodesetup.Containerd: nodesetup.ContainerdDir, nodesetup.CRIO: nodesetup.CRIODir}[runtime]
	if configDir == "" {
		return "", fmt.Errorf("node %s runs %s; node-setup knows containerd 2.x and CRI-O", node, runtime)
	}
	pod := l.PodSpec(podName, node, append([]string{"node-setup", "--runtime", runtime}, args...))
	pod.Spec.HostPID = true
	c := &pod.Spec.Containers[0]
	// Finding the runtime's process reads other processes' /proc entries.
	c.SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"SYS_PTRACE"}}
	for i, m := range []struct{ host, at string }{{configDir, configDir}, {filepath.Dir(nodesetup.Dir), filepath.Dir(nodesetup.Dir)}, {"/run", nodesetup.HostRun}} {
		name := fmt.Sprintf("host-%d", i)
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: m.at})
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: m.host, Type: ptr.To(corev1.HostPathDirectory)},
		}})
	}
	return l.runPod(ctx, pod)
}
