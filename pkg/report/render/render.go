// Package render draws migration records for the terminal: the list, one
// record's per-phase breakdown with its steps and bars, and the palette the
// CLI's live status shares.
package render

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"charm.land/lipgloss/v2"
	"charm.land/lipgloss/v2/table"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Options control terminal rendering.
type Options struct {
	// Colour draws bars in colour; without it bars use one glyph per phase.
	Colour bool
	// BarWidth is the width of the whole-migration bar.
	BarWidth int
	// Now is used for ages in the list.
	Now time.Time
	// NoHeaders leaves the list's header row out; AllNamespaces adds its
	// NAMESPACE column.
	NoHeaders, AllNamespaces bool
}

func (o Options) barWidth() int {
	if o.BarWidth <= 0 {
		return 60
	}
	return o.BarWidth
}

func newTable(headers ...string) *table.Table {
	return table.New().
		Border(lipgloss.RoundedBorder()).
		BorderStyle(borderStyle).
		Headers(headers...).
		StyleFunc(func(row, _ int) lipgloss.Style {
			if row == table.HeaderRow {
				return headerStyle
			}
			return cellStyle
		})
}

// List writes one row per migration as kubectl get does: plain columns a
// script can cut (no borders, no colour, one word a field), NAMESPACE first
// with o.AllNamespaces, no header row with o.NoHeaders. Nothing for no
// records: the caller says so on stderr.
func List(w io.Writer, records []*report.Record, o Options) error {
	if len(records) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	row := func(cells ...string) {
		if !o.AllNamespaces {
			cells = cells[1:]
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if !o.NoHeaders {
		row("NAMESPACE", "ID", "STRATEGY", "POD", "FROM", "TO", "OUTCOME", "DOWNTIME", "TOTAL", "AGE")
	}
	for _, r := range records {
		row(r.Namespace, r.ID, strategyText(r, "/"), r.Pod, cmpOr(r.SourceNode, "-"), cmpOr(r.TargetNode, "-"),
			string(r.Outcome), plainDash(downtimeText(r)), plainDash(totalText(r)), formatAge(o.Now, r.StartedAt))
	}
	return tw.Flush()
}

// RecoverHints writes, one line each, the command that ends each listed
// migration that did not end (for stderr, beside the list).
func RecoverHints(w io.Writer, records []*report.Record) error {
	for _, r := range records {
		if (len(r.Journal) > 0 || r.Drain != nil && r.Outcome == report.Interrupted) && r.Outcome != report.Running {
			if _, err := fmt.Fprintf(w, "%s did not end (%s); finish or undo it: %s\n", r.ID, r.Outcome, report.RecoverCommand(r.Namespace, r.ID)); err != nil {
				return err
			}
		}
	}
	return nil
}

func cmpOr(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// plainDash keeps a list's empty cells one ASCII field wide.
func plainDash(s string) string {
	if s == "–" || s == "" {
		return "-"
	}
	return s
}

// strategyText is the strategy with a StatefulSet pod's mode.
func strategyText(r *report.Record, sep string) string {
	if r.Mode == "" {
		return r.Strategy
	}
	return r.Strategy + sep + r.Mode
}

func downtimeText(r *report.Record) string {
	if r.Downtime == nil {
		return "–"
	}
	return FormatMillis(r.Downtime.Millis)
}

func totalText(r *report.Record) string {
	if r.TotalMillis == 0 {
		return "–"
	}
	return FormatMillis(r.TotalMillis)
}

// Record writes one migration in detail (a drain's record as Drain does): the paper's sub-process
// latency breakdown as a table with proportional bars, a stacked bar of the
// whole migration coloured by phase, and downtime against total time.
func Record(w io.Writer, r *report.Record, o Options) error {
	if r.Drain != nil {
		return Drain(w, r, o)
	}
	var b strings.Builder
	target := r.TargetPod
	if target == "" {
		target = "–"
	}
	fmt.Fprintf(&b, "%s %s\n", titleStyle.Render("Migration "+r.ID), outcomeStyle(r.Outcome).Render(string(r.Outcome)))
	line := func(label, value string) {
		fmt.Fprintf(&b, "%s %s\n", labelStyle.Render(fmt.Sprintf("%-10s", label)), value)
	}
	line("strategy", strategyText(r, ", StatefulSet pod in ")+map[bool]string{true: " mode"}[r.Mode != ""])
	line("pod", fmt.Sprintf("%s/%s → %s", r.Namespace, r.Pod, target))
	line("nodes", r.SourceNode+" → "+r.TargetNode)
	line("started", r.StartedAt.UTC().Format(time.RFC3339))
	if r.Error != "" {
		line("error", r.Error)
	}
	for _, l := range r.Leftovers {
		line("left", l)
	}
	b.WriteString("\n")

	elapsed := r.ElapsedMillis()
	t := newTable("PHASE", "DURATION", "SHARE", "")
	for _, p := range r.Phases {
		share := 0.0
		if elapsed > 0 {
			share = float64(p.DurationMillis) / float64(elapsed)
		}
		name := p.Label()
		if p.Error != "" {
			name += " ✗"
		} else if p.RolledBack {
			name += " ↺"
		}
		t.Row(name, FormatMillis(p.DurationMillis), fmt.Sprintf("%5.1f%%", 100*share),
			bar(share, 30, phaseColors[p.Name], o.Colour, "#"))
		for _, st := range p.Steps {
			share := 0.0
			if elapsed > 0 {
				share = float64(st.DurationMillis) / float64(elapsed)
			}
			t.Row(Dim.Render("  └ "+stepLabel(p, st)), Dim.Render(FormatMillis(st.DurationMillis)), Dim.Render(fmt.Sprintf("%5.1f%%", 100*share)),
				bar(share, 30, stepColor, o.Colour, "-"))
		}
	}
	b.WriteString(t.String() + "\n\n")

	b.WriteString(stackedBar(r, elapsed, o) + "\n")
	b.WriteString(legend(r, o) + "\n\n")

	b.WriteString(timesSummary(r, o))
	b.WriteString(predictionSummary(r))
	b.WriteString(brokerSummary(r))
	_, err := io.WriteString(w, b.String())
	return err
}

// predictionSummary sets what the migration expected as its preflight
// ended beside what happened.
func predictionSummary(r *report.Record) string {
	p := r.Prediction
	if p == nil || r.Outcome == report.Running {
		return ""
	}
	var parts []string
	add := func(what string, predicted, actual int64, known bool) {
		if predicted <= 0 {
			return
		}
		approx := " ≈ "
		if what == "downtime" && p.Freeze != nil && p.Freeze.AtMost() {
			approx = " ≤ " // from the pod's memory limit, not what it used
		}
		part := what + approx + FormatMillis(predicted)
		if known && actual > 0 {
			part += fmt.Sprintf(" (was %s, %+.0f%%)", FormatMillis(actual), 100*(float64(predicted)-float64(actual))/float64(actual))
		}
		parts = append(parts, part)
	}
	replay, hasReplay := r.Phase(report.Replay)
	add("total", p.TotalMillis, r.TotalMillis, r.Outcome == report.Succeeded)
	add("replay", p.ReplayMillis, replay.DurationMillis, hasReplay)
	add("downtime", p.DowntimeMillis, downtimeMillis(r), r.Downtime != nil)
	parts = append(parts, p.Warnings...)
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("%s %s\n", labelStyle.Render("expected            "), strings.Join(parts, " · "))
}

func downtimeMillis(r *report.Record) int64 {
	if r.Downtime == nil {
		return 0
	}
	return r.Downtime.Millis
}

// stepLabel names a step, with its container where the phase did it for
// more than one, and its throughput where it moved data.
func stepLabel(p report.PhaseTiming, st report.Step) string {
	label := string(st.Name)
	containers := map[string]bool{}
	for _, other := range p.Steps {
		if other.Name == st.Name {
			containers[other.Container] = true
		}
	}
	if len(containers) > 1 {
		label += " " + st.Container
	}
	if st.Bytes > 0 && st.DurationMillis > 0 {
		label += fmt.Sprintf(" (%s, %s/s)", formatBytes(st.Bytes), formatBytes(st.Bytes*1000/st.DurationMillis))
	}
	return label
}

// stackedBar gives every phase that took time one cell, so short phases
// stay visible, and splits the rest of the width by duration with the
// largest-remainder method, so the cells add up to the width exactly.
func stackedBar(r *report.Record, elapsed int64, o Options) string {
	width := o.barWidth()
	if elapsed <= 0 || len(r.Phases) == 0 {
		return strings.Repeat("·", width)
	}
	cells := make([]int, len(r.Phases))
	free := width
	for i, p := range r.Phases {
		if p.DurationMillis > 0 && free > 0 {
			cells[i], free = 1, free-1
		}
	}
	shares := make([]float64, len(r.Phases))
	spread := free
	for i, p := range r.Phases {
		exact := float64(p.DurationMillis) * float64(spread) / float64(elapsed)
		cells[i] += int(exact)
		free -= int(exact)
		shares[i] = exact - math.Floor(exact)
	}
	for ; free > 0; free-- {
		best := 0
		for j := range shares {
			if shares[j] > shares[best] {
				best = j
			}
		}
		cells[best]++
		shares[best] = -1
	}
	var b strings.Builder
	for i, p := range r.Phases {
		b.WriteString(bar(float64(cells[i])/float64(width), width, phaseColors[p.Name], o.Colour, phaseGlyphs[p.Name]))
	}
	return b.String()
}

func legend(r *report.Record, o Options) string {
	parts := make([]string, 0, len(r.Phases))
	seen := map[report.PhaseName]bool{}
	for _, p := range r.Phases {
		if seen[p.Name] {
			continue // a stage's repeat has the same colour
		}
		seen[p.Name] = true
		key := phaseGlyphs[p.Name]
		if o.Colour {
			key = lipgloss.NewStyle().Foreground(phaseColors[p.Name]).Render("█")
		}
		parts = append(parts, key+" "+string(p.Name))
	}
	return strings.Join(parts, "  ")
}

func timesSummary(r *report.Record, o Options) string {
	var b strings.Builder
	if r.TotalMillis == 0 {
		b.WriteString(labelStyle.Render("total migration time") + " – (the target never took over)\n")
		return b.String()
	}
	const width = 40
	fmt.Fprintf(&b, "%s %s  %s\n", labelStyle.Render("total migration time"), bar(1, width, lipgloss.Color("#3498db"), o.Colour, "="), FormatMillis(r.TotalMillis))
	if path := r.CriticalPathMillis(); path > 0 {
		overhead := r.OverheadMillis()
		fmt.Fprintf(&b, "%s %s from checkpoint to a restored copy holding: runtime %s, kubectl-migrate %s\n", labelStyle.Render("critical path       "),
			FormatMillis(path), FormatMillis(path-overhead), FormatMillis(overhead))
	}
	if r.Downtime == nil {
		b.WriteString(labelStyle.Render("downtime            ") + " – (no message arrived after the switchover to measure it)\n")
		return b.String()
	}
	share := float64(r.Downtime.Millis) / float64(r.TotalMillis)
	fmt.Fprintf(&b, "%s %s%s  %s (%.1f%% of total)\n", labelStyle.Render("downtime            "),
		bar(min(share, 1), width, lipgloss.Color("#e74c3c"), o.Colour, "="),
		strings.Repeat(" ", max(0, width-max(1, int(min(share, 1)*width+0.5)))),
		FormatMillis(r.Downtime.Millis), 100*share)
	if sh := r.Shadow; sh != nil {
		fmt.Fprintf(&b, "%s two switchovers through shadow %s: source → shadow %s, shadow → final pod %s\n", labelStyle.Render("                    "),
			sh.Pod, FormatMillis(sh.ToShadowMillis), FormatMillis(sh.ToFinalMillis))
		return b.String()
	}
	fmt.Fprintf(&b, "%s source applied #%d last; target applied #%d after it\n", labelStyle.Render("                    "), r.Downtime.SourceLastSeq, r.Downtime.NextSeq)
	return b.String()
}

func brokerSummary(r *report.Record) string {
	br := r.Broker
	if br.ReplayQueue == "" && br.PrimaryDepthAtSwitch == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n")
	if br.ReplayQueue != "" {
		fmt.Fprintf(&b, "%s λ %.2f msg/s · backlog %d at replay start · %d replayed · via %s\n",
			labelStyle.Render("replay  "), br.ArrivalRate, br.ReplayBacklog, br.Replayed, br.ReplayQueue)
	}
	if c := r.Cutoff; c != nil {
		fmt.Fprintf(&b, "%s %s\n", labelStyle.Render("cutoff  "), cutoffText(c))
	}
	fmt.Fprintf(&b, "%s %d messages waiting in the primary queue at switchover\n", labelStyle.Render("switch  "), br.PrimaryDepthAtSwitch)
	if r.ArchiveBytes > 0 {
		fmt.Fprintf(&b, "%s %d KiB of checkpoint in %d image(s)\n", labelStyle.Render("images  "), r.ArchiveBytes/1024, len(r.Images))
	}
	return b.String()
}

func cutoffText(c *report.Cutoff) string {
	var parts []string
	if c.FixedMillis > 0 {
		parts = append(parts, "fixed T_cutoff "+FormatMillis(c.FixedMillis))
	} else {
		parts = append(parts, "T_replay_max "+FormatMillis(c.ReplayMaxMillis),
			fmt.Sprintf("λ %.1f/s", c.ArrivalRate), fmt.Sprintf("μ %.1f/s", c.ServiceRate))
		if c.CutoffMillis > 0 {
			parts = append(parts, "T_cutoff "+FormatMillis(c.CutoffMillis))
		}
	}
	if c.Fired {
		parts = append(parts, "fired after "+FormatMillis(c.FiredAfterMillis))
	} else {
		parts = append(parts, "not needed (caught up)")
	}
	parts = append(parts, "replay took "+FormatMillis(c.ReplayMillis))
	return strings.Join(parts, " · ")
}
