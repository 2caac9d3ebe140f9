package render

import (
	"fmt"
	"io"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/check"
)

// SkipMark marks a link not checked because an earlier one failed.
var SkipMark = labelStyle.Render("·")

// Check writes a whole check: its header, a line per link (with the remedy
// under a failed one) and the verdict. The CLI writes the same pieces as
// they come.
func Check(w io.Writer, r check.Result) error {
	if _, err := io.WriteString(w, CheckHeader(r.From, r.To)+"\n"); err != nil {
		return err
	}
	for _, l := range r.Links {
		if _, err := io.WriteString(w, CheckLink(l)+"\n"); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, CheckVerdict(r)+"\n")
	return err
}

// CheckHeader names the two nodes.
func CheckHeader(from, to string) string {
	return fmt.Sprintf("%s %s → %s\n", titleStyle.Render("kubectl migrate check"), from, to)
}

// CheckLink is one link's line (and its remedy's).
func CheckLink(l check.Link) string {
	mark := DoneMark
	switch l.Status {
	case check.Failed:
		mark = FailMark
	case check.Skipped:
		return fmt.Sprintf("%s %s", SkipMark, Dim.Render(l.Name+"  not checked"))
	}
	line := fmt.Sprintf("%s %-16s %s %s", mark, l.Name, l.Detail, Dim.Render(FormatMillis(l.Millis)))
	if l.Remedy != "" {
		line += "\n    " + warnStyle.Render("→ "+l.Remedy)
	}
	return line
}

// CheckVerdict says whether a migration between the nodes can work.
func CheckVerdict(r check.Result) string {
	verdict := okStyle.Render(fmt.Sprintf("a migration from %s to %s can work", r.From, r.To))
	if !r.OK() {
		verdict = badStyle.Render(fmt.Sprintf("a migration from %s to %s would fail: fix the first ✗ and check again", r.From, r.To))
	}
	return fmt.Sprintf("\n%s %s", verdict, Dim.Render("("+FormatMillis(r.Millis)+")"))
}
