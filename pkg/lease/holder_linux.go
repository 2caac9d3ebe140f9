package lease

import (
	"fmt"
	"os"
	"strings"
)

// thisProcess identifies this process among all processes of all machines
// (the kernel's boot, its PID namespace, its PID and its start time), for
// the lease's ProcessAnnotation. A hostname and a PID would not: containers
// share hostnames and PIDs repeat across namespaces and reboots.
func thisProcess() string {
	boot, err1 := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns, err2 := os.Readlink("/proc/self/ns/pid")
	start, err3 := processStart("self")
	if err1 != nil || err2 != nil || err3 != nil {
		return ""
	}
	return fmt.Sprintf("%s/%s/%d/%s", strings.TrimSpace(string(boot)), ns, os.Getpid(), start)
}

// holderGone reports whether a lease's holder process (its
// ProcessAnnotation) ran in this kernel boot and PID namespace and no longer
// exists: its lease need not be waited out. Of a process elsewhere it cannot
// tell, and says no.
func holderGone(process string) bool {
	parts := strings.Split(process, "/")
	mine := strings.Split(thisProcess(), "/")
	if len(parts) != 4 || len(mine) != 4 || parts[0] != mine[0] || parts[1] != mine[1] {
		return false
	}
	start, err := processStart(parts[2])
	if os.IsNotExist(err) {
		return true
	}
	return err == nil && start != parts[3] // the PID now names another process
}

// processStart is the start time of process pid (clock ticks after boot).
func processStart(pid string) (string, error) {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", err
	}
	// The command name may hold spaces and parentheses: count from its end.
	i := strings.LastIndexByte(string(stat), ')')
	fields := strings.Fields(string(stat[i+1:]))
	if i < 0 || len(fields) < 20 {
		return "", fmt.Errorf("unexpected /proc/%s/stat", pid)
	}
	return fields[19], nil // field 22 of the whole line
}
