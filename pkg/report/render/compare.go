package render

import (
	"fmt"
	"io"
	"slices"
	"sort"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// Group is records drawn as one bar: their median per phase.
type Group struct {
	Label   string
	Records []*report.Record
}

// GroupBy puts records in one group per value of facet (report.Record
// Facets: a label, strategy, mode or outcome), in order of first
// appearance; with facet "", every record is a group of its own.
func GroupBy(records []*report.Record, facet string) []Group {
	var groups []Group
	index := map[string]int{}
	for _, r := range records {
		label := r.ID + " " + strategyText(r, "/")
		if facet != "" {
			label = facet + "=" + r.Facets()[facet]
		}
		i, ok := index[label]
		if !ok || facet == "" {
			i = len(groups)
			index[label] = i
			groups = append(groups, Group{Label: label})
		}
		groups[i].Records = append(groups[i].Records, r)
	}
	return groups
}

// Compare draws groups side by side: per group, its size, median downtime
// and total time, and a stacked bar of its median phases, coloured as the
// single record's chart and drawn to one scale.
func Compare(w io.Writer, groups []Group, o Options) error {
	if len(groups) == 0 {
		_, err := fmt.Fprintln(w, "No migrations match. List them with "+version.Command()+" report.")
		return err
	}
	medians := make([]*report.Record, len(groups))
	var longest int64
	for i, g := range groups {
		medians[i] = medianRecord(g.Records)
		longest = max(longest, medians[i].ElapsedMillis())
	}
	width := o.barWidth()
	t := newTable("RUNS", "N", "DOWNTIME", "TOTAL", "PHASES (median, one scale)")
	for i, g := range groups {
		m := medians[i]
		cells := width
		if longest > 0 {
			cells = max(1, int(int64(width)*m.ElapsedMillis()/longest))
		}
		t.Row(g.Label, fmt.Sprint(len(g.Records)), downtimeText(m), totalText(m), stackedBar(m, m.ElapsedMillis(), Options{Colour: o.Colour, BarWidth: cells}))
	}
	legendOf := &report.Record{}
	for _, m := range medians {
		legendOf.Phases = append(legendOf.Phases, m.Phases...)
	}
	_, err := fmt.Fprintf(w, "%s\n%s\n", t.String(), legend(legendOf, o))
	return err
}

// medianRecord is a record whose phases (by name and stage, in the order of
// the group's first record), total and downtime are the group's medians.
func medianRecord(records []*report.Record) *report.Record {
	if len(records) == 1 {
		return records[0]
	}
	type key struct {
		name  report.PhaseName
		stage string
	}
	var order []key
	durations := map[key][]int64{}
	var totals, downs []int64
	for _, r := range records {
		for _, p := range r.Phases {
			k := key{p.Name, p.Stage}
			if _, ok := durations[k]; !ok {
				order = append(order, k)
			}
			durations[k] = append(durations[k], p.DurationMillis)
		}
		totals = append(totals, r.TotalMillis)
		if r.Downtime != nil {
			downs = append(downs, r.Downtime.Millis)
		}
	}
	m := &report.Record{Strategy: records[0].Strategy, Mode: records[0].Mode, TotalMillis: medianOf(totals)}
	var start int64
	for _, k := range order {
		d := medianOf(durations[k])
		m.Phases = append(m.Phases, report.PhaseTiming{Name: k.name, Stage: k.stage, StartMillis: start, DurationMillis: d})
		start += d
	}
	if len(downs) > 0 {
		m.Downtime = &report.Downtime{Millis: medianOf(downs)}
	}
	return m
}

func medianOf(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
