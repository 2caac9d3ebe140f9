package render

import (
	"fmt"
	"image/color"
	"strings"
	"time"

	"charm.land/lipgloss/v2"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Styles are built here, once; the output writer downsamples or strips
// colour for the terminal (NO_COLOR, pipes, --color).
var (
	titleStyle  = lipgloss.NewStyle().Bold(true)
	labelStyle  = lipgloss.NewStyle().Foreground(lipgloss.Color("8"))
	headerStyle = lipgloss.NewStyle().Bold(true).Padding(0, 1)
	cellStyle   = lipgloss.NewStyle().Padding(0, 1)
	borderStyle = lipgloss.NewStyle().Foreground(lipgloss.Color("8"))
	okStyle     = lipgloss.NewStyle().Foreground(lipgloss.Color("2")).Bold(true)
	badStyle    = lipgloss.NewStyle().Foreground(lipgloss.Color("1")).Bold(true)
	warnStyle   = lipgloss.NewStyle().Foreground(lipgloss.Color("3")).Bold(true)
)

// The palette the CLI's live status shares with the report.
var (
	// Dim is for secondary text: labels, progress, durations.
	Dim      = labelStyle
	DoneMark = okStyle.Render("✓")
	FailMark = badStyle.Render("✗")
	UndoMark = warnStyle.Render("↺")
)

// phaseColors gives each phase its colour in bars and the legend.
var phaseColors = map[report.PhaseName]color.Color{
	report.Preflight:  lipgloss.Color("#7f8c8d"),
	report.Setup:      lipgloss.Color("#95a5a6"),
	report.Prepare:    lipgloss.Color("#9b59b6"),
	report.Stop:       lipgloss.Color("#c0392b"),
	report.Checkpoint: lipgloss.Color("#e67e22"),
	report.Image:      lipgloss.Color("#f1c40f"),
	report.Restore:    lipgloss.Color("#2ecc71"),
	report.Replay:     lipgloss.Color("#3498db"),
	report.Switchover: lipgloss.Color("#e84393"),
	report.Cleanup:    lipgloss.Color("#95a5a6"),
	report.Detach:     lipgloss.Color("#d35400"),
	report.Adopt:      lipgloss.Color("#16a085"),
}

// stepColor draws the bars of steps, under their phase's.
var stepColor = lipgloss.Color("#bdc3c7")

// phaseGlyphs stand in for colours in the stacked bar when colour is off.
var phaseGlyphs = map[report.PhaseName]string{
	report.Preflight: "p", report.Setup: "u", report.Prepare: "q", report.Stop: "s", report.Checkpoint: "C", report.Image: "I",
	report.Restore: "R", report.Replay: "P", report.Switchover: "S", report.Cleanup: "c", report.Detach: "d", report.Adopt: "a",
}

func outcomeStyle(o report.Outcome) lipgloss.Style {
	switch o {
	case report.Succeeded:
		return okStyle
	case report.Committed, report.Running:
		return warnStyle
	}
	return badStyle
}

// FormatMillis renders a duration in ms as "850ms" or "1.23s".
func FormatMillis(ms int64) string {
	if ms < 1000 {
		return fmt.Sprintf("%dms", ms)
	}
	return fmt.Sprintf("%.2fs", float64(ms)/1000)
}

// formatBytes renders a size in binary units.
func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func formatAge(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// bar renders a bar of width cells filled to share, in c (or with glyph when
// colour is off).
func bar(share float64, width int, c color.Color, colour bool, glyph string) string {
	n := int(share*float64(width) + 0.5)
	if share > 0 && n == 0 {
		n = 1 // a phase that ran is visible
	}
	if !colour {
		return strings.Repeat(glyph, n)
	}
	return lipgloss.NewStyle().Foreground(c).Render(strings.Repeat("█", n))
}
