//go:build unix

package migrate

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// holderGone reports whether a lease's holder ("HOST pid N") ran on this
// machine as a process that no longer exists: its lease need not be waited
// out.
func holderGone(holder string) bool {
	host, _ := os.Hostname()
	rest, ok := strings.CutPrefix(holder, host+" ")
	var pid int
	if n, _ := fmt.Sscanf(rest, "pid %d", &pid); !ok || n != 1 || pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
