package runtimesupport

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in                  string
		checkpoint, restore bool
	}{
		{"cri-o://1.34.0", true, true},
		{"cri-o://1.25.1", true, true},
		{"cri-o://1.24.6", false, false},
		{"containerd://2.0.5", true, false},
		{"containerd://2.1.9", true, true},
		{"containerd://2.3.0", true, true},
		{"containerd://2.4.0", true, false},
		{"containerd://1.7.20", false, false},
		{"docker://27.0.0", false, false},
		{"garbage", false, false},
		{"cri-o://v1.30.2-dev", true, true},
	} {
		s := Parse(tc.in)
		if s.Checkpoint != tc.checkpoint || s.Restore != tc.restore {
			t.Errorf("%s: checkpoint %v restore %v, want %v %v", tc.in, s.Checkpoint, s.Restore, tc.checkpoint, tc.restore)
		}
		if (!s.Checkpoint || !s.Restore) && s.Why == "" {
			t.Errorf("%s: no reason given", tc.in)
		}
	}
}
