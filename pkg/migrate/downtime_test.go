package migrate

import (
	"testing"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

func TestDowntimeBound(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		first, last protocol.State
		want        time.Duration
	}{
		{"no traffic", protocol.State{LastSeq: 5, LastAppliedAt: at}, protocol.State{LastSeq: 5, LastAppliedAt: at}, 0},
		{"10/s", protocol.State{LastSeq: 5, LastAppliedAt: at}, protocol.State{LastSeq: 105, LastAppliedAt: at.Add(10 * time.Second)}, 2500 * time.Millisecond},
		{"slow trickle", protocol.State{LastSeq: 5, LastAppliedAt: at}, protocol.State{LastSeq: 6, LastAppliedAt: at.Add(10 * time.Second)}, downtimeWait},
	} {
		if got := downtimeBound(tc.first, tc.last); got != tc.want {
			t.Errorf("%s: bound %v, want %v", tc.name, got, tc.want)
		}
	}
}
