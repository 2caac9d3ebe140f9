// Command eval draws the evaluation from the runs' CSV (kubectl migrate
// report -o csv, or what the lab benchmark writes with E2E_EVAL_DIR): the
// paper's figures — downtime and total migration time per strategy and
// message rate (box plots: median, quartiles, spread, every run kept) and
// the per-phase breakdown per strategy (stacked median phases) — as PNG and
// SVG, and a summary table of our reductions beside the paper's, with how
// far each migration's own prediction was from what it took.
//
//	go run ./test/eval -in eval/runs.csv -out eval
package main

import (
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot/vg"
)

func main() {
	in := flag.String("in", "eval/runs.csv", "the runs, as kubectl migrate report -o csv writes them")
	out := flag.String("out", "eval", "directory for the figures and summary.md")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "eval:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	runs, err := readRuns(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	cells := group(runs)
	for _, fig := range []struct {
		name, title string
		value       func(migrationRun) (float64, bool)
		log         bool
	}{
		{"downtime", "Downtime", func(r migrationRun) (float64, bool) { return r.downtime, r.hasDowntime }, true},
		{"total", "Total migration time", func(r migrationRun) (float64, bool) { return r.total, r.total > 0 }, false},
	} {
		if err := boxes(cells, fig.title, fig.value, fig.log, filepath.Join(out, fig.name)); err != nil {
			return err
		}
	}
	if err := phases(cells, filepath.Join(out, "phases")); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "summary.md"), []byte(summary(cells)), 0o644)
}

// migrationRun is one migration of the CSV.
type migrationRun struct {
	variant, rate   string
	outcome         string
	downtime, total float64 // ms
	hasDowntime     bool
	predictedTotal  float64            // ms, 0: no prediction
	phases          map[string]float64 // ms, by column name without phase_ and _ms
	phaseOrder      []string
}

// readRuns reads the CSV report.WriteCSV writes; a migrationRun's variant is its
// variant label, else its strategy (and mode).
func readRuns(r io.Reader) ([]migrationRun, error) {
	rows, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) < 2 {
		return nil, errors.New("no runs")
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	get := func(row []string, name string) string {
		if i, ok := col[name]; ok && i < len(row) {
			return row[i]
		}
		return ""
	}
	var phaseCols []string
	for _, h := range rows[0] {
		if strings.HasPrefix(h, "phase_") {
			phaseCols = append(phaseCols, h)
		}
	}
	var runs []migrationRun
	for _, row := range rows[1:] {
		r := migrationRun{variant: get(row, "label_variant"), rate: get(row, "label_rate"), outcome: get(row, "outcome"), phases: map[string]float64{}}
		if r.variant == "" {
			r.variant = strings.TrimSuffix(get(row, "strategy")+"/"+get(row, "mode"), "/")
		}
		if r.rate == "" {
			r.rate = "?"
		}
		r.total, _ = strconv.ParseFloat(get(row, "total_ms"), 64)
		r.predictedTotal, _ = strconv.ParseFloat(get(row, "predicted_total_ms"), 64)
		if d := get(row, "downtime_ms"); d != "" {
			r.downtime, _ = strconv.ParseFloat(d, 64)
			r.hasDowntime = true
		}
		for _, c := range phaseCols {
			if v := get(row, c); v != "" {
				name := phaseName(strings.TrimSuffix(strings.TrimPrefix(c, "phase_"), "_ms"))
				ms, _ := strconv.ParseFloat(v, 64)
				r.phases[name] += ms
				if !slices.Contains(r.phaseOrder, name) {
					r.phaseOrder = append(r.phaseOrder, name)
				}
			}
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// cell is every migrationRun of one variant at one rate.
type cell struct {
	variant, rate string
	runs          []migrationRun
}

// group puts runs in cells, ordered by rate (numerically) then variant in
// order of first appearance.
func group(runs []migrationRun) []cell {
	var variants []string
	index := map[[2]string]int{}
	var cells []cell
	for _, r := range runs {
		if !slices.Contains(variants, r.variant) {
			variants = append(variants, r.variant)
		}
		k := [2]string{r.variant, r.rate}
		i, ok := index[k]
		if !ok {
			i = len(cells)
			index[k] = i
			cells = append(cells, cell{variant: r.variant, rate: r.rate})
		}
		cells[i].runs = append(cells[i].runs, r)
	}
	rate := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
	sort.SliceStable(cells, func(i, j int) bool {
		if rate(cells[i].rate) != rate(cells[j].rate) {
			return rate(cells[i].rate) < rate(cells[j].rate)
		}
		return slices.Index(variants, cells[i].variant) < slices.Index(variants, cells[j].variant)
	})
	return cells
}

// byRate splits cells into one panel's worth per rate, in order.
func byRate(cells []cell) [][]cell {
	var panels [][]cell
	for _, c := range cells {
		if n := len(panels); n > 0 && panels[n-1][0].rate == c.rate {
			panels[n-1] = append(panels[n-1], c)
			continue
		}
		panels = append(panels, []cell{c})
	}
	return panels
}

// The figures are drawn for the width GitHub shows them at (its page
// column, about 880 px: 100 px an inch), so that the smallest text, at
// fontSize, is readable there (12 px and up); the PNG has twice the pixels.
const (
	figureWidth = 8.8 * vg.Inch
	shownPPI    = 100 // pixels an inch where GitHub shows the figure
	fontSize    = 9   // points: tick labels, axis labels, legends
	titleSize   = 11
)

// succeeded says whether a run's figures describe a migration that
// happened; a rolled-back one's are drawn apart, marked.
func (r migrationRun) succeeded() bool { return r.outcome == "succeeded" }

// rolledBack counts c's runs that did not succeed: its figures are of the
// others only.
func (c cell) rolledBack() int {
	n := 0
	for _, r := range c.runs {
		if !r.succeeded() {
			n++
		}
	}
	return n
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// paper are the seed paper's headline reductions, for the summary.
const paper = `The paper: MS2M cuts downtime by 96.99–97.18 % against stop-and-copy; the
threshold cutoff at 16 msg/s cuts total time by 36.08 %; StatefulSet
migration (MS2M, sequential) cuts downtime by 24.84 / 16.31 / 0.24 % at
4 / 10 / 16 msg/s against StatefulSet stop-and-copy.`

// baseline is the variant a variant's downtime is compared with:
// StatefulSet variants with StatefulSet stop-and-copy, the others with
// stop-and-copy.
func baseline(variant string) string {
	if strings.HasPrefix(variant, "sts-") {
		return "sts-stop-and-copy"
	}
	return "stop-and-copy"
}

// summary is a table of medians per cell, with each variant's downtime
// against its stop-and-copy baseline's and the cutoff's total against
// MS2M's at the same rate, and the median error of the migrations'
// predicted totals ((predicted − actual) / actual).
func summary(cells []cell) string {
	var b strings.Builder
	b.WriteString("| rate | strategy | runs | succeeded | median downtime | median total | vs stop-and-copy (downtime) | vs ms2m (total) | prediction error (total) |\n|---|---|---|---|---|---|---|---|---|\n")
	med := func(c cell, f func(migrationRun) (float64, bool)) (float64, bool) {
		var all []float64
		for _, r := range c.runs {
			if v, ok := f(r); ok {
				all = append(all, v)
			}
		}
		return median(all), len(all) > 0
	}
	down := func(r migrationRun) (float64, bool) { return r.downtime, r.hasDowntime && r.succeeded() }
	total := func(r migrationRun) (float64, bool) { return r.total, r.total > 0 && r.succeeded() }
	find := func(rate, variant string) (cell, bool) {
		for _, c := range cells {
			if c.rate == rate && c.variant == variant {
				return c, true
			}
		}
		return cell{}, false
	}
	for _, c := range cells {
		ok := 0
		for _, r := range c.runs {
			if r.succeeded() {
				ok++
			}
		}
		d, hasD := med(c, down)
		t, hasT := med(c, total)
		vsSC, vsMS2M, predErr := "", "", ""
		if sc, found := find(c.rate, baseline(c.variant)); found && hasD && c.variant != baseline(c.variant) {
			if scd, ok := med(sc, down); ok && scd > 0 {
				vsSC = fmt.Sprintf("%+.1f %%", 100*(d-scd)/scd)
			}
		}
		if ms, found := find(c.rate, "ms2m"); found && hasT && c.variant != "ms2m" && baseline(c.variant) == "stop-and-copy" && c.variant != "stop-and-copy" {
			if mst, ok := med(ms, total); ok && mst > 0 {
				vsMS2M = fmt.Sprintf("%+.1f %%", 100*(t-mst)/mst)
			}
		}
		if e, ok := med(c, func(r migrationRun) (float64, bool) {
			return (r.predictedTotal - r.total) / r.total, r.predictedTotal > 0 && r.total > 0 && r.outcome == "succeeded"
		}); ok {
			predErr = fmt.Sprintf("%+.0f %%", 100*e)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %s | %s | %s | %s | %s |\n", c.rate, c.variant, len(c.runs), ok, ms(d, hasD), ms(t, hasT), vsSC, vsMS2M, predErr)
	}
	b.WriteString("\n" + paper + "\n")
	return b.String()
}

func ms(v float64, ok bool) string {
	if !ok {
		return "–"
	}
	if v < 1000 {
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.2f s", v/1000)
}
