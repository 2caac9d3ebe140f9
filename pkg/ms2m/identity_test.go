package ms2m

import "testing"

func TestMayRunIn(t *testing.T) {
	homes := []string{"team/consumer", "team/consumer-x1"}
	for _, tc := range []struct {
		where string
		want  bool
	}{
		{"team/consumer", true},
		{"team/consumer-x1", true},
		{"attacker/consumer-x1", false},
		{"team/other", false},
		{"/consumer-x1", true}, // a pod with no namespace file: names only
		{"/other", false},
		{"", true}, // unknown: never stop a copy on a guess
	} {
		if got := mayRunIn(homes, tc.where); got != tc.want {
			t.Errorf("mayRunIn(%v, %q) = %t, want %t", homes, tc.where, got, tc.want)
		}
	}
	if !mayRunIn(nil, "any/where") {
		t.Error("a state that knows no home (an old checkpoint) must run anywhere")
	}
}
