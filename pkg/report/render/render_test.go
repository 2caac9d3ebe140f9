package render

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/charmbracelet/colorprofile"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var t0 = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

func sampleRecord() *report.Record {
	return &report.Record{
		ID: "x7k2p", Strategy: "ms2m", Namespace: "default", Pod: "consumer", TargetPod: "consumer-x7k2p",
		SourceNode: "node-a", TargetNode: "node-b", StartedAt: t0, Outcome: report.Succeeded,
		Phases: []report.PhaseTiming{
			{Name: report.Preflight, StartMillis: 0, DurationMillis: 120},
			{Name: report.Prepare, StartMillis: 120, DurationMillis: 80},
			{Name: report.Checkpoint, StartMillis: 200, DurationMillis: 450, Steps: []report.Step{
				{Name: report.CheckpointCall, Container: "app", StartMillis: 210, DurationMillis: 420}}},
			{Name: report.Image, StartMillis: 650, DurationMillis: 1900, Steps: []report.Step{
				{Name: report.Pack, Container: "app", StartMillis: 660, DurationMillis: 300, Bytes: 1740 << 10},
				{Name: report.Push, Container: "app", StartMillis: 960, DurationMillis: 1500, Bytes: 1740 << 10}}},
			{Name: report.Restore, StartMillis: 2550, DurationMillis: 1300, Steps: []report.Step{
				{Name: report.PodCreate, StartMillis: 2560, DurationMillis: 20},
				{Name: report.PodRunning, StartMillis: 2580, DurationMillis: 1000},
				{Name: report.AppHolding, StartMillis: 3580, DurationMillis: 260}}},
			{Name: report.Replay, StartMillis: 3850, DurationMillis: 2600},
			{Name: report.Switchover, StartMillis: 6450, DurationMillis: 150},
			{Name: report.Cleanup, StartMillis: 6600, DurationMillis: 900},
		},
		TotalMillis: 6600,
		Downtime:    &report.Downtime{Millis: 62, SourceLastSeq: 410, NextSeq: 411},
		Broker:      report.Broker{ReplayQueue: "work.ms2m-replay", ArrivalRate: 10.04, ReplayBacklog: 38, Replayed: 52, PrimaryDepthAtSwitch: 1},
		Images:      []string{"reg/consumer@sha256:1"}, ArchiveBytes: 1740 * 1024,
		Prediction: &report.Prediction{Lambda: 10, LambdaWindowMillis: 1300, Mu: 19.6, MuFrom: report.MuFromApplication,
			CriticalPathMillis: 3000, Backlog: 31, ReplayMillis: 3200, TotalMillis: 7300, DowntimeMillis: 51},
	}
}

func cutoffRecord() *report.Record {
	r := sampleRecord()
	r.ID = "c5t0f"
	r.Cutoff = &report.Cutoff{ReplayMaxMillis: 5000, ArrivalRate: 16.1, ServiceRate: 19.6, CutoffMillis: 6087, Fired: true, FiredAfterMillis: 6140, ReplayMillis: 4820}
	return r
}

func shadowRecord() *report.Record {
	r := sampleRecord()
	r.ID, r.Pod, r.TargetPod, r.Mode = "s4d0w", "consumer-0", "consumer-0", "shadow"
	var phases []report.PhaseTiming
	start := int64(120)
	add := func(stage string, names ...report.PhaseName) {
		for _, n := range names {
			phases = append(phases, report.PhaseTiming{Name: n, Stage: stage, StartMillis: start, DurationMillis: 400})
			start += 400
		}
	}
	phases = append(phases, report.PhaseTiming{Name: report.Preflight, DurationMillis: 120})
	add("shadow", report.Prepare, report.Checkpoint, report.Image, report.Restore, report.Replay, report.Switchover)
	add("final", report.Prepare, report.Checkpoint, report.Image, report.Detach, report.Restore, report.Adopt, report.Replay, report.Switchover, report.Cleanup)
	r.Phases, r.TotalMillis = phases, start-400
	r.Shadow = &report.Shadow{Pod: "consumer-0-shadow", ToShadowMillis: 48, ToFinalMillis: 61}
	r.Downtime = &report.Downtime{Millis: 109, SourceLastSeq: 530, NextSeq: 531}
	return r
}

func rolledBackRecord() *report.Record {
	return &report.Record{
		ID: "q9w8e", Strategy: "stop-and-copy", Namespace: "default", Pod: "consumer",
		SourceNode: "node-a", TargetNode: "node-c", StartedAt: t0.Add(-3 * time.Hour), Outcome: report.RolledBack,
		Error:     "restore: restored container app: CreateContainerError: criu failed",
		Leftovers: []string{"checkpoint images reg/consumer@sha256:1 (delete them from the registry)"},
		Phases: []report.PhaseTiming{
			{Name: report.Preflight, DurationMillis: 100, RolledBack: true},
			{Name: report.Stop, StartMillis: 100, DurationMillis: 40, RolledBack: true},
			{Name: report.Checkpoint, StartMillis: 140, DurationMillis: 500, RolledBack: true},
			{Name: report.Image, StartMillis: 640, DurationMillis: 2000, RolledBack: true},
			{Name: report.Restore, StartMillis: 2640, DurationMillis: 3000, Error: "restore: criu failed", RolledBack: true},
		},
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file; got:\n%s", name, got)
	}
}

// render writes through a colour writer of the given profile, as the CLI does.
func render(t *testing.T, profile colorprofile.Profile, fn func(*colorprofile.Writer) error) []byte {
	var buf bytes.Buffer
	w := &colorprofile.Writer{Forward: &buf, Profile: profile}
	if err := fn(w); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRenderRecordGolden(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rec     *report.Record
		profile colorprofile.Profile
	}{
		{"record-plain", sampleRecord(), colorprofile.NoTTY},
		{"record-ansi", sampleRecord(), colorprofile.ANSI256},
		{"record-rolled-back", rolledBackRecord(), colorprofile.NoTTY},
		{"record-cutoff", cutoffRecord(), colorprofile.NoTTY},
		{"record-shadow", shadowRecord(), colorprofile.NoTTY},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := render(t, tc.profile, func(w *colorprofile.Writer) error {
				return Record(w, tc.rec, Options{Colour: tc.profile >= colorprofile.ANSI, Now: t0})
			})
			golden(t, tc.name, out)
		})
	}
}

func TestRenderListGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"list", Options{}},
		{"list-no-headers", Options{NoHeaders: true}},
		{"list-all-namespaces", Options{AllNamespaces: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Now = t0.Add(5 * time.Minute)
			var out bytes.Buffer
			if err := List(&out, []*report.Record{sampleRecord(), shadowRecord(), rolledBackRecord()}, tc.opts); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name, out.Bytes())
			// One field per column, for awk: every row has as many.
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			for _, l := range lines {
				if len(strings.Fields(l)) != len(strings.Fields(lines[0])) {
					t.Errorf("%q has %d fields, the first row %d", l, len(strings.Fields(l)), len(strings.Fields(lines[0])))
				}
			}
		})
	}
}

func TestStackedBarFillsTheWidth(t *testing.T) {
	r := sampleRecord()
	for _, width := range []int{8, 40, 60, 123} {
		bar := stackedBar(r, r.ElapsedMillis(), Options{BarWidth: width})
		if n := len([]rune(bar)); n != width {
			t.Errorf("width %d: bar has %d cells", width, n)
		}
		// Every phase that ran is visible.
		for _, p := range r.Phases {
			if !strings.Contains(bar, phaseGlyphs[p.Name]) {
				t.Errorf("width %d: phase %s missing from %q", width, p.Name, bar)
			}
		}
	}
}

func TestCompareGolden(t *testing.T) {
	a, b, c := sampleRecord(), sampleRecord(), rolledBackRecord()
	a.Labels, b.Labels, c.Labels = map[string]string{"rate": "10"}, map[string]string{"rate": "10"}, map[string]string{"rate": "4"}
	b.ID, b.TotalMillis, b.Downtime = "b2b2b", 8000, &report.Downtime{Millis: 90}
	b.Phases[5].DurationMillis = 4000 // a longer replay
	for _, tc := range []struct {
		name  string
		facet string
	}{{"compare-runs", ""}, {"compare-by-rate", "rate"}} {
		t.Run(tc.name, func(t *testing.T) {
			out := render(t, colorprofile.NoTTY, func(w *colorprofile.Writer) error {
				return Compare(w, GroupBy([]*report.Record{a, b, c}, tc.facet), Options{BarWidth: 40})
			})
			golden(t, tc.name, out)
		})
	}
}

func TestCSVKeepsEveryRun(t *testing.T) {
	var buf bytes.Buffer
	if err := report.WriteCSV(&buf, []*report.Record{sampleRecord(), shadowRecord(), rolledBackRecord()}); err != nil {
		t.Fatal(err)
	}
	golden(t, "runs.csv", buf.Bytes())
}

// A checklist's lines: ✓ with the detail and time, ✗ with what to change
// under it, · for an item not looked at.
func TestChecklistItems(t *testing.T) {
	for _, tc := range []struct {
		item Item
		want string
	}{
		{Item{Name: "nodes", Detail: "node-a cri-o://1.34.0", Millis: 3, NameWidth: 8}, "✓ nodes    node-a cri-o://1.34.0 3ms"},
		{Item{Name: "restore", State: Failed, Detail: "node-b does not restore", Remedy: "run node-setup"}, "✗ restore node-b does not restore\n    → run node-setup"},
		{Item{Name: "canary", State: Skipped}, "· canary  not checked"},
		{Item{Name: "tls", State: Skipped, Detail: "no broker TLS"}, "· tls  not checked: no broker TLS"},
	} {
		got := string(render(t, colorprofile.NoTTY, func(w *colorprofile.Writer) error {
			_, err := io.WriteString(w, ChecklistItem(tc.item))
			return err
		}))
		if got != tc.want {
			t.Errorf("ChecklistItem(%+v) = %q, want %q", tc.item, got, tc.want)
		}
	}
}
