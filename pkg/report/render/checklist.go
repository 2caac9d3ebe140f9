package render

import (
	"fmt"
	"strings"
)

// A checklist is how check, conformance and a dry run's preflight show
// what they looked at: a line per item, ✓, ✗ with what to change, or · for
// one not looked at, and a verdict. The packages that check fill Items;
// this one draws them, knowing none of those packages.

// ItemState is how an item of a checklist came out.
type ItemState int

const (
	Passed ItemState = iota
	Failed
	Skipped // not looked at, as an earlier item failed (Detail: why, if not that)
)

// Item is one line of a checklist.
type Item struct {
	Name  string
	State ItemState
	// Detail is what was seen; Remedy, under a failed item, what to change.
	Detail, Remedy string
	Millis         int64 // 0: no time shown
	// NameWidth pads the name so that details line up (0: none).
	NameWidth int
}

// SkipMark marks an item not looked at.
var SkipMark = labelStyle.Render("·")

// ChecklistHeader names the command and what it looks at.
func ChecklistHeader(command, subject string) string {
	return fmt.Sprintf("%s %s\n", titleStyle.Render(command), subject)
}

// ChecklistItem is an item's line, and its remedy's under it.
func ChecklistItem(it Item) string {
	name := it.Name
	if it.NameWidth > 0 {
		name = fmt.Sprintf("%-*s", it.NameWidth, it.Name)
	}
	if it.State == Skipped {
		return fmt.Sprintf("%s %s", SkipMark, Dim.Render(strings.TrimSpace(it.Name+"  not checked"+prefixed(": ", it.Detail))))
	}
	mark := DoneMark
	if it.State == Failed {
		mark = FailMark
	}
	line := strings.TrimRight(fmt.Sprintf("%s %s %s", mark, name, it.Detail), " ")
	if it.Millis > 0 {
		line += " " + Dim.Render(FormatMillis(it.Millis))
	}
	if it.Remedy != "" {
		line += "\n    " + warnStyle.Render("→ "+it.Remedy)
	}
	return line
}

// ChecklistVerdict is the closing line: good if ok, else bad, with the
// whole time if millis > 0.
func ChecklistVerdict(ok bool, good, bad string, millis int64) string {
	verdict := okStyle.Render(good)
	if !ok {
		verdict = badStyle.Render(bad)
	}
	if millis > 0 {
		verdict += " " + Dim.Render("("+FormatMillis(millis)+")")
	}
	return "\n" + verdict
}

func prefixed(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + s
}
