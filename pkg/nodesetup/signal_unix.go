//go:build unix

package nodesetup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// signalRuntime stops the node's runtime with SIGTERM and waits for its
// process to end. The runtime is the process (the agent sees the host's)
// whose root holds the very socket mounted into the agent: on a machine
// running several nodes' runtimes, this node's.
func (o Options) signalRuntime(ctx context.Context) error {
	mounted, err := os.Stat(o.Socket)
	if err != nil {
		return err
	}
	names := map[string]string{Containerd: "containerd", CRIO: "crio"}
	procs, _ := filepath.Glob(o.host("/proc/[0-9]*"))
	pid := 0
	var others []string // the runtime's processes of other nodes (or errors)
	for _, p := range procs {
		exe, err := os.Readlink(filepath.Join(p, "exe"))
		if err != nil || filepath.Base(exe) != names[o.Runtime] {
			continue
		}
		st, err := statIn(filepath.Join(p, "root"), o.runtimeSocketOnHost())
		if err == nil && os.SameFile(st, mounted) {
			fmt.Sscanf(filepath.Base(p), "%d", &pid)
			break
		}
		others = append(others, fmt.Sprintf("%s: %v", filepath.Base(p), err))
	}
	if pid == 0 {
		return fmt.Errorf("no %s process serves %s here (among %d processes; %d of %s: %v)", names[o.Runtime], o.runtimeSocketOnHost(), len(procs), len(others), names[o.Runtime], others)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return syscall.Kill(pid, 0) != nil, nil
	})
}
