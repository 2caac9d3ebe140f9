//go:build !linux

package agent

import "errors"

// errNoFence: network namespaces and nftables are Linux's; the agent runs
// on Linux nodes only, and the plugin, built for every OS, never fences.
var errNoFence = errors.New("a fence needs Linux")

func fenceNetns(string, bool) error { return errNoFence }

// Fenced reports whether the network namespace pinned at path has the
// fence.
func Fenced(string) (bool, error) { return false, errNoFence }
