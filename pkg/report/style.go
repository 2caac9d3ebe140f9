package report

import (
	"fmt"
	"image/color"
	"strings"
	"time"

	"charm.land/lipgloss/v2"
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

// phaseColors gives each phase its colour in bars and the legend.
var phaseColors = map[PhaseName]color.Color{
	Preflight:  lipgloss.Color("#7f8c8d"),
	Prepare:    lipgloss.Color("#9b59b6"),
	Stop:       lipgloss.Color("#c0392b"),
	Checkpoint: lipgloss.Color("#e67e22"),
	Image:      lipgloss.Color("#f1c40f"),
	Restore:    lipgloss.Color("#2ecc71"),
	Replay:     lipgloss.Color("#3498db"),
	Switchover: lipgloss.Color("#e84393"),
	Cleanup:    lipgloss.Color("#95a5a6"),
	Detach:     lipgloss.Color("#d35400"),
	Adopt:      lipgloss.Color("#16a085"),
}

// phaseGlyphs stand in for colours in the stacked bar when colour is off.
var phaseGlyphs = map[PhaseName]string{
	Preflight: "p", Prepare: "q", Stop: "s", Checkpoint: "C", Image: "I",
	Restore: "R", Replay: "P", Switchover: "S", Cleanup: "c", Detach: "d", Adopt: "a",
}

func outcomeStyle(o Outcome) lipgloss.Style {
	switch o {
	case Succeeded:
		return okStyle
	case Committed, Running:
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
