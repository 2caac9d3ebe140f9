// Package runtimesupport tells from a node's reported container runtime whether it
// can checkpoint and restore containers, so preflight can refuse a migration
// before anything is changed.
package runtimesupport

import (
	"fmt"
	"strconv"
	"strings"
)

// Support is what a runtime can do.
type Support struct {
	Name       string // e.g. "cri-o"
	Version    string // e.g. "1.34.0"
	Checkpoint bool
	Restore    bool
	// Why explains a missing capability.
	Why string
}

// Parse reads node.status.nodeInfo.containerRuntimeVersion, e.g.
// "cri-o://1.34.0" or "containerd://2.1.9".
//
// CRI-O checkpoints and restores since 1.25. containerd checkpoints since 2.0,
// restores from 2.1 to 2.3 and dropped restore in 2.4.
func Parse(runtimeVersion string) Support {
	name, version, ok := strings.Cut(runtimeVersion, "://")
	s := Support{Name: name, Version: version}
	if !ok {
		s.Why = fmt.Sprintf("unrecognised runtime %q", runtimeVersion)
		return s
	}
	major, minor, ok := majorMinor(version)
	if !ok {
		s.Why = fmt.Sprintf("unrecognised %s version %q", name, version)
		return s
	}
	switch name {
	case "cri-o":
		s.Checkpoint = major > 1 || minor >= 25
		s.Restore = s.Checkpoint
		if !s.Checkpoint {
			s.Why = "CRI-O checkpoints and restores from 1.25 on; upgrade CRI-O"
		}
	case "containerd":
		s.Checkpoint = major >= 2
		s.Restore = major == 2 && minor >= 1 && minor <= 3
		switch {
		case !s.Checkpoint:
			s.Why = "containerd checkpoints from 2.0 on; upgrade containerd"
		case !s.Restore && minor == 0:
			s.Why = "containerd 2.0 cannot restore; use containerd 2.1–2.3 or CRI-O"
		case !s.Restore:
			s.Why = "containerd " + version + " has no checkpoint restore (removed in 2.4); use containerd 2.1–2.3 or CRI-O"
		}
	default:
		s.Why = fmt.Sprintf("runtime %q does not support checkpoint/restore; use CRI-O ≥ 1.25 or containerd 2.1–2.3", name)
	}
	return s
}

func majorMinor(v string) (int, int, bool) {
	v = strings.TrimPrefix(v, "v")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	return major, minor, err1 == nil && err2 == nil
}
