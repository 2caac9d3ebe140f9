package runtimesupport

import (
	"os"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in                  string
		checkpoint, restore bool
		optIn               string
	}{
		{"cri-o://1.34.0", true, true, ""},
		{"cri-o://1.25.1", true, true, ""},
		{"cri-o://1.24.6", false, false, ""},
		{"containerd://2.0.5", true, false, ""},
		{"containerd://2.1.9", true, true, ""},
		{"containerd://2.2.6", true, true, ""},
		{"containerd://2.2.7", true, true, ContainerdRestoreOptIn},
		{"containerd://2.2.9", true, true, ContainerdRestoreOptIn},
		{"containerd://2.3.0", true, true, ""},
		{"containerd://2.3.3", true, true, ""},
		{"containerd://v2.3.4", true, true, ContainerdRestoreOptIn},
		{"containerd://2.3.7", true, true, ContainerdRestoreOptIn},
		{"containerd://2.4.0", true, false, ""},
		{"containerd://1.7.20", false, false, ""},
		{"docker://27.0.0", false, false, ""},
		{"garbage", false, false, ""},
		{"containerd://Unknown", false, false, ""}, // the kubelet while its runtime restarts
		{"cri-o://v1.30.2-dev", true, true, ""},
	} {
		s := Parse(tc.in)
		if s.Checkpoint != tc.checkpoint || s.Restore != tc.restore || s.OptIn != tc.optIn {
			t.Errorf("%s: checkpoint %v restore %v opt-in %q, want %v %v %q", tc.in, s.Checkpoint, s.Restore, s.OptIn, tc.checkpoint, tc.restore, tc.optIn)
		}
		if (!s.Checkpoint || !s.Restore) && s.Why == "" {
			t.Errorf("%s: no reason given", tc.in)
		}
	}
}

// The testdata configurations are what the lab's runtimes reported in a
// verbose CRI Status: containerd 2.3.7 with its restore opt-in off and on,
// CRI-O 1.34.0 (which predates its opt-in).
func TestWithConfig(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name, runtime, config string
		checkpoint, restore   bool
		why                   string
	}{
		{"containerd opted in", "containerd://2.3.7", read("containerd-2.3.7-restore-on.json"), true, true, ""},
		{"containerd at its default", "containerd://2.3.7", read("containerd-2.3.7-restore-off.json"), true, false, "enable_experimental_restore_via_create = true"},
		{"containerd without CRIU", "containerd://2.3.7", `{"enableCRIU":false,"enableExperimentalRestoreViaCreate":true}`, false, false, "enable_criu = true"},
		{"containerd 2.4 stays without restore", "containerd://2.4.0", `{"enableExperimentalRestoreViaCreate":true}`, true, false, "removed in 2.4"},
		{"containerd that does not say", "containerd://2.1.9", "", true, true, ""},
		{"CRI-O with CRIU off", "cri-o://1.34.0", `{"sandboxImage":"p","crio":{"EnableCriuSupport":false}}`, false, false, "enable_criu_support = true"},
		{"CRI-O 1.34.0 as the lab's reports itself", "cri-o://1.34.0", read("cri-o-1.34.0.json"), true, true, ""},
		{"CRI-O 1.34.0 as is", "cri-o://1.34.0", `{"sandboxImage":"p","crio":{"EnableCriuSupport":true}}`, true, true, ""},
		{"CRI-O reporting checkpoint only", "cri-o://1.34.9", `{"crio":{"EnableCriuSupport":true},"checkpoint_restore":{"container_level_enabled":"checkpoint_only"}}`, true, false, `container_level_enabled = "checkpoint_restore"`},
		{"CRI-O reporting restore on", "cri-o://1.34.9", `{"crio":{"CheckpointRestore":{"ContainerLevelEnabled":"checkpoint_restore"}}}`, true, true, ""},
		{"garbage", "cri-o://1.34.0", `{not json`, true, true, ""},
	} {
		s := Parse(tc.runtime).WithConfig(tc.config)
		if s.Checkpoint != tc.checkpoint || s.Restore != tc.restore || !strings.Contains(s.Why, tc.why) {
			t.Errorf("%s: checkpoint %v restore %v why %q; want %v %v, why naming %q", tc.name, s.Checkpoint, s.Restore, s.Why, tc.checkpoint, tc.restore, tc.why)
		}
	}
}

func TestExplainRestoreFailure(t *testing.T) {
	// As the lab's containerd 2.3.7 reports it in the container's status.
	got, ok := ExplainRestoreFailure("containerd://2.3.7", "restored container consumer: CreateContainerError: checkpoint restore via CreateContainer is disabled by configuration")
	if !ok || !strings.Contains(got, "enable_experimental_restore_via_create = true") || !strings.Contains(got, "containerd 2.3.7") {
		t.Errorf("containerd's refusal: %q %v", got, ok)
	}
	if got, ok := ExplainRestoreFailure("cri-o://1.34.0", "CreateContainerError: failed to restore: CRIU restore failed"); ok {
		t.Errorf("a CRIU failure is not a refusal: %q", got)
	}
}
