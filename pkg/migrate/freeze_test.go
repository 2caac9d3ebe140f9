package migrate

import (
	"math"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// The freeze is fitted on earlier moves of different sizes, and falls back
// to the lab's figures where they cannot tell how it grows.
func TestFitFreeze(t *testing.T) {
	move := func(mib int64, millis int64) *report.Record {
		return &report.Record{ArchiveBytes: mib << 20, Downtime: &report.Downtime{Millis: millis}}
	}
	perMiB := func(f freezeFit) float64 { return f.millisPerByte * (1 << 20) }
	for _, tc := range []struct {
		name         string
		moves        []*report.Record
		base, perMiB float64
		runs         int
	}{
		{"none: the lab's", nil, labFreezeBaseMillis, labFreezeMillisPerMiB, 0},
		{"one: the lab's", []*report.Record{move(300, 4000)}, labFreezeBaseMillis, labFreezeMillisPerMiB, 0},
		{"one size: the lab's", []*report.Record{move(300, 4000), move(300, 3000)}, labFreezeBaseMillis, labFreezeMillisPerMiB, 0},
		{"two sizes", []*report.Record{move(5, 1050), move(321, 2000), move(5, 950)}, 985, 3.2, 3},
		{"growing not at all", []*report.Record{move(5, 2000), move(500, 1000)}, 1500, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fitFreeze(tc.moves)
			if math.Abs(f.baseMillis-tc.base) > 10 || math.Abs(perMiB(f)-tc.perMiB) > 0.05 || f.runs != tc.runs {
				t.Fatalf("base %.0f ms + %.2f ms/MiB from %d runs, want %.0f + %.2f from %d", f.baseMillis, perMiB(f), f.runs, tc.base, tc.perMiB, tc.runs)
			}
		})
	}
}
