// Package runtimesupport tells whether a node's container runtime can
// checkpoint and restore containers: from the version the node reports,
// refined by the runtime's own configuration (which the target's agent reads
// over CRI), so that preflight refuses a migration before anything changes,
// and a restore the runtime refuses ends with the setting that allows it.
package runtimesupport

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Settings that turn checkpoint/restore on, each with its file and table.
const (
	ContainerdRestoreOptIn = `set enable_experimental_restore_via_create = true under [plugins."io.containerd.cri.v1.runtime"] in /etc/containerd/config.toml and restart containerd`
	ContainerdCRIU         = `set enable_criu = true under [plugins."io.containerd.cri.v1.runtime"] in /etc/containerd/config.toml (and install CRIU ≥ 3.16) and restart containerd`
	CRIORestoreOptIn       = `set container_level_enabled = "checkpoint_restore" under [crio.checkpoint_restore] in /etc/crio/crio.conf (or a file in /etc/crio/crio.conf.d/) and restart CRI-O`
	CRIOCRIU               = `set enable_criu_support = true under [crio.runtime] in /etc/crio/crio.conf (and install CRIU) and restart CRI-O`
)

// Support is what a runtime can do.
type Support struct {
	Name       string // e.g. "cri-o"
	Version    string // e.g. "1.34.0"
	Checkpoint bool
	Restore    bool
	// OptIn is the setting a runtime of this version needs before it
	// restores, or "" if restore is on by default.
	OptIn string
	// Configured: Restore was read from the runtime's own configuration,
	// not only inferred from its version.
	Configured bool
	// Why explains a missing capability and names the fix.
	Why string
}

// Parse reads node.status.nodeInfo.containerRuntimeVersion, e.g.
// "cri-o://1.34.0" or "containerd://2.3.7".
//
// CRI-O checkpoints and restores since 1.25; patch releases of 1.30–1.36
// from September 2026 on default to checkpoint only (CRIORestoreOptIn),
// which only the runtime's configuration tells. containerd checkpoints
// since 2.0 and restores from 2.1 to 2.3; 2.2.7+ and 2.3.4+ only when
// opted in (ContainerdRestoreOptIn); 2.4 removed restore.
func Parse(runtimeVersion string) Support {
	name, version, ok := strings.Cut(runtimeVersion, "://")
	s := Support{Name: name, Version: version}
	if !ok {
		s.Why = fmt.Sprintf("unrecognised runtime %q", runtimeVersion)
		return s
	}
	if strings.EqualFold(version, "unknown") {
		s.Why = "the kubelet does not know its runtime's version (" + runtimeVersion + "): the runtime restarted or is unreachable; wait until kubectl get node -o wide shows its version, then try again"
		return s
	}
	major, minor, patch, ok := parseVersion(version)
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
		if s.Restore && (minor == 2 && patch >= 7 || minor == 3 && patch >= 4) {
			s.OptIn = ContainerdRestoreOptIn
		}
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

// WithConfig refines s with the runtime's configuration as it reports it
// (the "config" of a verbose CRI Status: containerd's CRI config, or
// CRI-O's {"crio": runtime config}). Keys it does not know leave s as it is.
func (s Support) WithConfig(config string) Support {
	var cfg map[string]any
	if config == "" || json.Unmarshal([]byte(config), &cfg) != nil || !s.Checkpoint {
		return s
	}
	off := func(setting string) {
		s.Restore, s.Configured = false, true
		s.Why = fmt.Sprintf("%s %s has restore turned off: %s", displayName(s.Name), s.Version, setting)
	}
	switch s.Name {
	case "containerd":
		if v, ok := cfg["enableCRIU"].(bool); ok && !v {
			s.Checkpoint = false
			off(ContainerdCRIU)
			return s
		}
		if v, ok := cfg["enableExperimentalRestoreViaCreate"].(bool); ok && s.Restore {
			s.OptIn = ContainerdRestoreOptIn
			if !v {
				off(ContainerdRestoreOptIn)
				return s
			}
			s.Configured = true
		}
	case "cri-o":
		crio, _ := cfg["crio"].(map[string]any)
		if v, ok := crio["EnableCriuSupport"].(bool); ok && !v {
			s.Checkpoint = false
			off(CRIOCRIU)
			return s
		}
		// Releases with [crio.checkpoint_restore] may report its level.
		if level, ok := findKey(cfg, "container_level_enabled", "ContainerLevelEnabled", "containerLevelEnabled"); ok {
			s.OptIn = CRIORestoreOptIn
			s.Configured = true
			if l, _ := level.(string); l != "checkpoint_restore" {
				off(CRIORestoreOptIn)
			}
		}
	}
	return s
}

// ExplainRestoreFailure turns a runtime's refusal to restore (a container's
// waiting message) into the setting that allows it; ok is false for other
// failures.
func ExplainRestoreFailure(runtimeVersion, message string) (string, bool) {
	s := Parse(runtimeVersion)
	m := strings.ToLower(message)
	switch {
	case strings.Contains(m, "restore via createcontainer is disabled"):
		return fmt.Sprintf("%s refuses to restore: %s", describe(s), ContainerdRestoreOptIn), true
	case strings.Contains(m, "criu support is disabled"):
		return fmt.Sprintf("%s refuses to restore: %s", describe(s), ContainerdCRIU), true
	case strings.Contains(m, "checkpoint_only") || strings.Contains(m, "checkpoint/restore support not configured") ||
		s.Name == "cri-o" && strings.Contains(m, "restore") && strings.Contains(m, "disabled"):
		return fmt.Sprintf("%s refuses to restore: %s", describe(s), CRIORestoreOptIn), true
	}
	return "", false
}

func describe(s Support) string {
	if s.Version == "" {
		return "the target's runtime"
	}
	return "the target's " + displayName(s.Name) + " " + s.Version
}

func displayName(name string) string {
	if name == "cri-o" {
		return "CRI-O"
	}
	return name
}

// findKey looks for any of keys at any depth of v.
func findKey(v any, keys ...string) (any, bool) {
	switch t := v.(type) {
	case map[string]any:
		for _, k := range keys {
			if x, ok := t[k]; ok {
				return x, true
			}
		}
		for _, x := range t {
			if found, ok := findKey(x, keys...); ok {
				return found, true
			}
		}
	case []any:
		for _, x := range t {
			if found, ok := findKey(x, keys...); ok {
				return found, true
			}
		}
	}
	return nil, false
}

func parseVersion(v string) (major, minor, patch int, ok bool) {
	v = strings.TrimPrefix(v, "v")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, 0, false
	}
	digits := func(s string) string {
		if i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			return s[:i]
		}
		return s
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(digits(parts[1]))
	if len(parts) == 3 {
		patch, _ = strconv.Atoi(digits(parts[2]))
	}
	return major, minor, patch, err1 == nil && err2 == nil
}
