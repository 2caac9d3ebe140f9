package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupV1Root is where this machine's (hybrid) cgroup v1 controllers live.
const cgroupV1Root = "/sys/fs/cgroup"

func cgroupControllers() []string {
	entries, _ := os.ReadDir(cgroupV1Root)
	var ctrls []string
	for _, e := range entries {
		// Skip the unified (v2) mount and controller aliases (symlinks).
		if e.IsDir() && e.Name() != "unified" {
			ctrls = append(ctrls, e.Name())
		}
	}
	return ctrls
}

// makeCgroupRoot creates a node's kubelet cgroupRoot in every controller.
func makeCgroupRoot(name string) error {
	for _, c := range cgroupControllers() {
		dir := filepath.Join(cgroupV1Root, c, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if c == "cpuset" { // a new cpuset has no CPUs until given its parent's
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(cgroupV1Root, c, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// cgroupPIDs lists every process in a cgroup tree, in any controller: a
// restored process may sit at a path in one controller and not in another.
func cgroupPIDs(name string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, c := range cgroupControllers() {
		_ = filepath.WalkDir(filepath.Join(cgroupV1Root, c, name), func(p string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || e.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// emptyCgroupRoot ends every process left in a node's cgroup trees and removes
// the trees. A container's init ignores SIGTERM sent from outside its PID
// namespace, and a frozen task cannot die until it is thawed, so it thaws and
// sends SIGKILL, then waits until the trees are empty: rmdir of a cgroup whose
// last task is still exiting fails with EBUSY.
func emptyCgroupRoot(name string, timeout time.Duration) error {
	thawCgroupRoot(name)
	if err := waitFor("the processes in cgroup "+name+" to exit", timeout, func() error {
		pids := cgroupPIDs(name)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if len(pids) > 0 {
			return fmt.Errorf("%d left: %v", len(pids), pids)
		}
		return nil
	}); err != nil {
		return err
	}
	return waitFor("cgroup "+name+" removed", timeout, func() error { return removeCgroupRoot(name) })
}

// thawCgroupRoot thaws every freezer cgroup of a node's tree.
func thawCgroupRoot(name string) {
	_ = filepath.WalkDir(filepath.Join(cgroupV1Root, "freezer", name), func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() && e.Name() == "freezer.state" {
			_ = os.WriteFile(p, []byte("THAWED"), 0o644)
		}
		return nil
	})
}

// removeCgroupRoot removes a node's cgroup trees, deepest first.
func removeCgroupRoot(name string) error {
	var firstErr error
	for _, c := range cgroupControllers() {
		var dirs []string
		_ = filepath.WalkDir(filepath.Join(cgroupV1Root, c, name), func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, dir := range dirs {
			if err := os.Remove(dir); err != nil && !os.IsNotExist(err) && firstErr == nil {
				firstErr = err
			}
		}
	}
	return firstErr
}
