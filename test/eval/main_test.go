package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

func record(id, strategy, variant, rate string, downtime, total int64, replay int64) *report.Record {
	return &report.Record{
		ID: id, Strategy: strategy, Namespace: "ns", Pod: "consumer", SourceNode: "node-a", TargetNode: "node-b",
		StartedAt: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), Outcome: report.Succeeded,
		TotalMillis: total, Downtime: &report.Downtime{Millis: downtime},
		Labels: map[string]string{"variant": variant, "rate": rate},
		Phases: []report.PhaseTiming{
			{Name: report.Preflight, DurationMillis: 1000},
			{Name: report.Checkpoint, StartMillis: 1000, DurationMillis: 200},
			{Name: report.Restore, StartMillis: 1200, DurationMillis: 1000},
			{Name: report.Replay, StartMillis: 2200, DurationMillis: replay},
		},
	}
}

// TestEvaluationFromCSV: the figures exist in both formats, and the
// summary has the medians and the reductions computed from the same runs.
func TestEvaluationFromCSV(t *testing.T) {
	var csv bytes.Buffer
	records := []*report.Record{
		record("a1", "ms2m", "ms2m", "10", 50, 5000, 2000), record("a2", "ms2m", "ms2m", "10", 52, 6000, 2500), record("a3", "ms2m", "ms2m", "10", 54, 7000, 3000),
		record("b1", "stop-and-copy", "stop-and-copy", "10", 1000, 2500, 0), record("b2", "stop-and-copy", "stop-and-copy", "10", 1300, 2600, 0),
		record("c1", "ms2m", "cutoff", "10", 900, 3000, 1000),
		record("d1", "ms2m", "ms2m", "4", 51, 3000, 500),
		record("e1", "ms2m", "sts-sequential", "10", 6000, 9000, 0), record("f1", "stop-and-copy", "sts-stop-and-copy", "10", 8000, 8000, 0),
	}
	for i, predicted := range []int64{5500, 5400, 7700} { // +10 %, -10 %, +10 %
		records[i].Prediction = &report.Prediction{TotalMillis: predicted}
	}
	if err := report.WriteCSV(&csv, records); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if keep := os.Getenv("EVAL_KEEP"); keep != "" {
		dir = keep // to look at the figures
	}
	in := filepath.Join(dir, "runs.csv")
	if err := os.WriteFile(in, csv.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(in, dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"downtime", "total", "phases"} {
		for _, ext := range []string{".png", ".svg"} {
			if fi, err := os.Stat(filepath.Join(dir, name+ext)); err != nil || fi.Size() < 1000 {
				t.Errorf("%s%s: %v", name, ext, err)
			}
		}
	}
	sum, err := os.ReadFile(filepath.Join(dir, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 4 | ms2m | 1 | 1 | 51 ms | 3.00 s |",
		"| 10 | ms2m | 3 | 3 | 52 ms | 6.00 s | -95.5 % |  | +10 % |", // 52 against (1000+1300)/2
		"| 10 | cutoff | 1 | 1 | 900 ms | 3.00 s | -21.7 % | -50.0 % |  |",
		"| 10 | sts-sequential | 1 | 1 | 6.00 s | 9.00 s | -25.0 % |  |  |", // against sts-stop-and-copy, not stop-and-copy
		"| 10 | sts-stop-and-copy | 1 | 1 | 8.00 s | 8.00 s |  |",
	} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum)
		}
	}
}

// TestRolledBackRunsAreMarkedNotBoxed: a run that rolled back is left out
// of the boxes and drawn apart; the figures' smallest text is 12 px or more
// where GitHub shows them.
func TestRolledBackRunsAreMarkedNotBoxed(t *testing.T) {
	c := cell{variant: "ms2m", rate: "10", runs: []migrationRun{
		{outcome: "succeeded", downtime: 50, hasDowntime: true},
		{outcome: "rolled-back", downtime: 3000, hasDowntime: true},
		{outcome: "succeeded", downtime: 70, hasDowntime: true},
	}}
	ok, back := valuesOf(c, func(r migrationRun) (float64, bool) { return r.downtime, r.hasDowntime })
	if len(ok) != 2 || len(back) != 1 || back[0] != 3 {
		t.Fatalf("boxed %v, marked %v", ok, back)
	}
	if p := panel("Downtime", []cell{c}); !strings.Contains(fmt.Sprint(p.X.Tick.Marker.Ticks(0, 1)), "ms2m (1/3 rolled back)") {
		t.Fatalf("the variant's label does not say how many rolled back: %v", p.X.Tick.Marker.Ticks(0, 1))
	}
	if px := fontPixels(fontSize); px < 12 {
		t.Fatalf("the smallest text is %.1f px where GitHub shows the figures", px)
	}
}
