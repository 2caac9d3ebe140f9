//go:build unix

package ociruntime

import (
	"os"
	"syscall"
)

// Exec replaces this process with runc, as asked: every file descriptor
// the caller passed (--preserve-fds) stays where runc expects it.
func (r Runtime) Exec(args []string) error {
	return syscall.Exec(r.Runc, append([]string{"runc"}, args...), os.Environ())
}
