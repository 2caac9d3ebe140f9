package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// A node is a network namespace plus a persistent mount namespace whose root
// is an overlay of the shared rootfs (CRIU needs a real pivot_root; a chroot
// confuses its mount tree). Container storage and kubelet state are bind
// mounts of plain directories, since overlayfs cannot host overlay storage.
func (d dirs) nodeNsFile(n labNode) string { return filepath.Join(d.node(n), "ns", "mnt") }

var nodeMountDirs = []string{"upper", "work", "root", "containers", "kubelet", "log", "ns"}

func (d dirs) nodeUp(n labNode) error {
	base := d.node(n)
	for _, sub := range nodeMountDirs {
		if err := os.MkdirAll(filepath.Join(base, sub), 0o755); err != nil {
			return err
		}
	}
	rt, err := d.runtime()
	if err != nil {
		return err
	}
	files, err := nodeFiles(d, n, rt)
	if err != nil {
		return err
	}
	if err := writeFiles(filepath.Join(base, "upper"), files); err != nil {
		return err
	}
	if err := d.nodeMountNamespace(n, rt); err != nil {
		return fmt.Errorf("%s: mount namespace: %w", n.Name, err)
	}
	if err := makeCgroupRoot("klab-" + n.Name); err != nil {
		return fmt.Errorf("%s: cgroups: %w", n.Name, err)
	}
	if err := d.startRuntime(rt, n, nodeEnv); err != nil {
		return err
	}
	return d.start(n.Name+"-kubelet", d.inNode(n, "/opt/lab/bin/kubelet",
		"--config=/etc/kubernetes/kubelet.yaml", "--kubeconfig=/etc/kubernetes/kubelet.kubeconfig",
		"--hostname-override="+n.Name, "--node-ip="+n.IP, "--v=1"), nodeEnv)
}

// nodeEnv is the environment of a node's daemons.
const nodePath = "PATH=/opt/lab/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

var nodeEnv = []string{nodePath, "HOME=/root", "LANG=C.UTF-8"}

func (d dirs) pidOf(name string) string {
	pid, _ := d.running(name)
	return fmt.Sprint(pid)
}

// inNode wraps argv to run inside the node's network and mount namespaces.
func (d dirs) inNode(n labNode, argv ...string) []string {
	return append([]string{"nsenter", "--net=/run/netns/" + n.netns(), "--mount=" + d.nodeNsFile(n), "--"}, argv...)
}

// nodeMountNamespace creates the node's persistent mount namespace (bound to
// a file) and pivots it into the overlay root.
func (d dirs) nodeMountNamespace(n labNode, rt nodeRuntime) error {
	base := d.node(n)
	nsDir := filepath.Join(base, "ns")
	if mounted(nsDir) {
		return nil
	}
	// A namespace file can only be bound under a private mount.
	if err := run("mount", "--bind", nsDir, nsDir); err != nil {
		return err
	}
	if err := run("mount", "--make-private", nsDir); err != nil {
		return err
	}
	nsFile := d.nodeNsFile(n)
	if err := os.WriteFile(nsFile, nil, 0o644); err != nil {
		return err
	}
	if err := run("unshare", "--mount="+nsFile, "--propagation", "private", "true"); err != nil {
		return err
	}
	r := filepath.Join(base, "root")
	script := strings.Join([]string{
		"set -e",
		fmt.Sprintf("mount -t overlay overlay -o lowerdir=%s,upperdir=%s/upper,workdir=%s/work %s", d.rootfs(), base, base, r),
		fmt.Sprintf("mkdir -p %[1]s%[2]s %[1]s/var/lib/kubelet %[1]s/var/log %[1]s/opt/lab/bin %[1]s/oldroot", r, rt.storage),
		fmt.Sprintf("mount --bind %s/containers %s%s", base, r, rt.storage),
		// rshared: the kubelet's volume mounts must propagate into containers.
		fmt.Sprintf("mount --bind %s/kubelet %s/var/lib/kubelet && mount --make-rshared %s/var/lib/kubelet", base, r, r),
		fmt.Sprintf("mount --bind %s/log %s/var/log", base, r),
		fmt.Sprintf("mount --bind %s %s/opt/lab/bin && mount -o remount,bind,ro %s/opt/lab/bin", filepath.Join(d.cache, "bin"), r, r),
		fmt.Sprintf("mount -t proc proc %s/proc", r),
		// A sysfs mounted from the node's network namespace shows its devices.
		fmt.Sprintf("mount -t sysfs sysfs %s/sys && mount --rbind /sys/fs/cgroup %s/sys/fs/cgroup", r, r),
		fmt.Sprintf("mount --rbind /dev %s/dev", r),
		// rshared as on a systemd node: an agent that fences a pod mounts
		// the network namespaces the runtime pins under /run/netns later.
		fmt.Sprintf("mount -t tmpfs tmpfs %s/run && mount --make-rshared %s/run && mkdir -p %s/run/netns %s/run/lock", r, r, r, r),
		fmt.Sprintf("mount -t tmpfs tmpfs %s/tmp", r),
		"cd " + r,
		"pivot_root . oldroot",
		"umount -l /oldroot",
	}, "\n")
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.netns(), "--mount="+nsFile, "--", "sh", "-c", script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

func mounted(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

func (d dirs) nodeDown(n labNode) []error {
	var errs []error
	// Both runtimes' names: down must work whatever the lab came up with.
	for _, p := range []string{n.Name + "-kubelet", runtimes["crio"].daemon(n), runtimes["containerd"].daemon(n), runtimes["containerd-2.4"].daemon(n)} {
		if err := d.stop(p, 15*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	// Containers and their monitors live in the node's cgroup tree; the
	// runtime that would have stopped them is down.
	if err := emptyCgroupRoot("klab-"+n.Name, 30*time.Second); err != nil {
		errs = append(errs, err)
	}
	nsDir := filepath.Join(d.node(n), "ns")
	if mounted(nsDir) {
		_ = syscall.Unmount(d.nodeNsFile(n), syscall.MNT_DETACH)
		if err := syscall.Unmount(nsDir, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", nsDir, err))
		}
	}
	return errs
}
