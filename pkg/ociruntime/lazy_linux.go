package ociruntime

import (
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// loopbackUp brings up lo in this process's network namespace, new and
// empty: the page server and the lazy-pages daemon listen and dial there.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// helperAttr detaches a helper into a session of its own (it outlives the
// invocation that starts it) and, isolated, a network namespace of its own.
func helperAttr(isolated bool) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setsid: true}
	if isolated {
		attr.Cloneflags = syscall.CLONE_NEWNET
	}
	return attr
}

// processAlive: pid runs (a zombie has ended).
func processAlive(pid int) bool {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
