package render

import (
	"cmp"
	"fmt"
	"io"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Drain writes a node drain: a row per moved pod (its strategy, target,
// downtime, total and outcome, with the migration to look at), the pods it
// left with why, and what it evicted.
func Drain(w io.Writer, r *report.Record, o Options) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s\n", titleStyle.Render("drain"), r.SourceNode, outcomeStyle(r.Outcome).Render(string(r.Outcome)))
	fmt.Fprintf(&b, "%s %s    %s %s\n\n", labelStyle.Render("id"), r.ID, labelStyle.Render("took"), totalText(r))
	d := r.Drain
	if len(d.Moves) > 0 {
		t := newTable("POD", "KIND", "TARGET", "MIGRATION", "DOWNTIME", "TOTAL", "OUTCOME")
		for _, m := range d.Moves {
			kind := "pod"
			if m.StatefulSet != "" {
				kind = "sts " + m.StatefulSet
			}
			downtime, total := "–", "–"
			if m.Outcome == report.Succeeded {
				downtime, total = FormatMillis(m.DowntimeMillis), FormatMillis(m.TotalMillis)
			}
			t.Row(m.Namespace+"/"+m.Pod, kind, m.Target, cmp.Or(m.Migration, "–"), downtime, total, outcomeStyle(m.Outcome).Render(string(m.Outcome)))
		}
		b.WriteString(t.String() + "\n")
	}
	for _, m := range d.Moves {
		if m.Error != "" {
			fmt.Fprintf(&b, "%s %s/%s: %s\n", FailMark, m.Namespace, m.Pod, m.Error)
		}
	}
	if len(d.Skipped) > 0 {
		fmt.Fprintf(&b, "\n%s\n", labelStyle.Render(fmt.Sprintf("left on %s (%d):", r.SourceNode, len(d.Skipped))))
		for _, s := range d.Skipped {
			fmt.Fprintf(&b, "  %s/%s  %s\n", s.Namespace, s.Pod, labelStyle.Render(s.Reason))
		}
	}
	if len(d.Evicted) > 0 {
		fmt.Fprintf(&b, "\n%s %s\n", labelStyle.Render("evicted:"), strings.Join(d.Evicted, ", "))
	}
	if d.Uncordoned {
		fmt.Fprintf(&b, "\n%s was uncordoned: the drain stopped early\n", r.SourceNode)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
