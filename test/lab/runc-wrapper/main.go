// Command runc-wrapper is the lab nodes' OCI runtime: it adapts each bundle
// to this machine, then runs Debian's runc.
//
// The machine lacks CAP_SYS_RESOURCE, so a negative oomScoreAdj (which the
// kubelet asks for) fails container creation; it is clamped to 0. The
// machine's hugetlb controller sits on cgroup v2 while the rest is v1, so
// hugepage limits are dropped. CRI-O deletes CRIU's restore.log when a
// restore fails, and a failed dump's log goes with its container; copies are
// kept under /var/log/criu-restore and /var/log/criu-dump.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

const realRunc = "/usr/sbin/runc"

func main() {
	args := os.Args[1:]
	if slices.ContainsFunc(args, func(a string) bool { return a == "create" || a == "run" || a == "restore" }) {
		if err := adaptBundle(flagValue(args, "--bundle", "-b")); err != nil {
			fmt.Fprintln(os.Stderr, "runc-wrapper:", err)
		}
	}
	// CRIU's log of a restore or a dump, kept when runc fails (CRI-O
	// deletes the restore's, and the dump's goes with the container).
	criuLog := map[string]string{"restore": "restore.log", "checkpoint": "dump.log"}
	op := slices.IndexFunc(args, func(a string) bool { return criuLog[a] != "" })
	if op < 0 {
		err := syscall.Exec(realRunc, append([]string{"runc"}, args...), os.Environ())
		fmt.Fprintln(os.Stderr, "runc-wrapper: exec runc:", err)
		os.Exit(127)
	}
	cmd := exec.Command(realRunc, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	if args[op] == "restore" || err != nil {
		keepCRIULog(flagValue(args, "--work-path"), criuLog[args[op]], cmd.ProcessState.ExitCode())
	}
	if err != nil {
		os.Exit(max(1, cmd.ProcessState.ExitCode()))
	}
}

func flagValue(args []string, names ...string) string {
	for i, a := range args {
		for _, n := range names {
			if a == n && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, n+"="); ok {
				return v
			}
		}
	}
	return ""
}

func adaptBundle(bundle string) error {
	if bundle == "" {
		bundle = "."
	}
	path := filepath.Join(bundle, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	if p, ok := spec["process"].(map[string]any); ok {
		if adj, ok := p["oomScoreAdj"].(float64); ok && adj < 0 {
			p["oomScoreAdj"] = 0
		}
	}
	if l, ok := spec["linux"].(map[string]any); ok {
		if r, ok := l["resources"].(map[string]any); ok {
			delete(r, "hugepageLimits")
		}
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

func keepCRIULog(workPath, name string, code int) {
	if workPath == "" {
		return
	}
	data, err := os.ReadFile(filepath.Join(workPath, name))
	if err != nil {
		return
	}
	dir := "/var/log/criu-" + strings.TrimSuffix(name, ".log")
	_ = os.MkdirAll(dir, 0o755)
	_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%s-rc%d.log", strings.TrimSuffix(name, ".log"), time.Now().Format("150405.000"), code)), data, 0o644)
}
