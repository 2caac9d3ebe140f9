//go:build !linux

package ociruntime

import (
	"errors"
	"syscall"
)

func loopbackUp() error { return errors.New("lazy pages need Linux") }

func helperAttr(bool) *syscall.SysProcAttr { return nil }

func processAlive(int) bool { return false }
