package ociruntime

import (
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
