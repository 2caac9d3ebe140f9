package report

import (
	"encoding/csv"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// phaseOrder is the order phase columns come in.
var phaseOrder = []PhaseName{Preflight, Setup, Prepare, Stop, Checkpoint, Image, Detach, Restore, Adopt, Replay, Switchover, Cleanup}

// Facets are a record's labels with its strategy, mode and outcome, for
// selecting and grouping records (a label of the same name wins).
func (r *Record) Facets() map[string]string {
	f := map[string]string{"strategy": r.Strategy, "outcome": string(r.Outcome)}
	if r.Mode != "" {
		f["mode"] = r.Mode
	}
	maps.Copy(f, r.Labels)
	return f
}

// WriteCSV writes one row per record, every run kept: identity, outcome,
// times in milliseconds (total, downtime, critical path and our overhead on
// it, each phase by stage, each step summed over phases), the broker's
// figures, and the labels. Columns are the union over the records.
func WriteCSV(w io.Writer, records []*Record) error {
	phaseCols, stepCols, labelCols := csvColumns(records)
	header := []string{"id", "strategy", "mode", "namespace", "pod", "source_node", "target_node", "started", "outcome",
		"total_ms", "downtime_ms", "critical_path_ms", "overhead_ms", "lambda", "mu", "backlog", "replayed", "archive_bytes",
		"predicted_total_ms", "predicted_replay_ms", "predicted_downtime_ms", "to_shadow_ms", "to_final_ms"}
	for _, c := range phaseCols {
		header = append(header, "phase_"+c+"_ms")
	}
	for _, c := range stepCols {
		header = append(header, "step_"+strings.ReplaceAll(strings.ReplaceAll(c, " → ", "_to_"), " ", "_")+"_ms")
	}
	for _, c := range labelCols {
		header = append(header, "label_"+c)
	}
	out := csv.NewWriter(w)
	if err := out.Write(header); err != nil {
		return err
	}
	for _, r := range records {
		downtime := ""
		if r.Downtime != nil {
			downtime = ms(r.Downtime.Millis)
		}
		row := []string{r.ID, r.Strategy, r.Mode, r.Namespace, r.Pod, r.SourceNode, r.TargetNode, r.StartedAt.UTC().Format(time.RFC3339), string(r.Outcome),
			ms(r.TotalMillis), downtime, ms(r.CriticalPathMillis()), ms(r.OverheadMillis()),
			strconv.FormatFloat(r.Broker.ArrivalRate, 'f', 2, 64), rate(r.ReplayRate()), strconv.Itoa(r.Broker.ReplayBacklog), strconv.FormatUint(r.Broker.Replayed, 10),
			strconv.FormatInt(r.ArchiveBytes, 10)}
		if p := r.Prediction; p != nil {
			row = append(row, msKnown(p.TotalMillis), msKnown(p.ReplayMillis), msKnown(p.DowntimeMillis))
		} else {
			row = append(row, "", "", "")
		}
		if sh := r.Shadow; sh != nil { // shadow mode's two gaps, which downtime adds up
			row = append(row, ms(sh.ToShadowMillis), ms(sh.ToFinalMillis))
		} else {
			row = append(row, "", "")
		}
		phases, steps := map[string]int64{}, map[string]int64{}
		for _, p := range r.Phases {
			phases[phaseColumn(p)] += p.DurationMillis
			for _, s := range p.Steps {
				steps[string(s.Name)] += s.DurationMillis
			}
		}
		for _, c := range phaseCols {
			row = append(row, msIf(phases, c))
		}
		for _, c := range stepCols {
			row = append(row, msIf(steps, c))
		}
		for _, c := range labelCols {
			row = append(row, r.Labels[c])
		}
		if err := out.Write(row); err != nil {
			return err
		}
	}
	out.Flush()
	return out.Error()
}

func ms(v int64) string { return strconv.FormatInt(v, 10) }

// msKnown is v, or empty where zero means unknown.
func msKnown(v int64) string {
	if v == 0 {
		return ""
	}
	return ms(v)
}

func rate(v float64) string {
	if v == 0 {
		return ""
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

func msIf(m map[string]int64, key string) string {
	if v, ok := m[key]; ok {
		return ms(v)
	}
	return ""
}

func phaseColumn(p PhaseTiming) string {
	if p.Stage == "" {
		return string(p.Name)
	}
	return string(p.Name) + "_" + p.Stage
}

// csvColumns are the phase (in run order), step and label columns the
// records have.
func csvColumns(records []*Record) (phases, steps, labels []string) {
	seenPhase, seenStep, seenLabel := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, stage := range []string{"", "shadow", "final"} {
		for _, name := range phaseOrder {
			for _, r := range records {
				for _, p := range r.Phases {
					if p.Name == name && p.Stage == stage && !seenPhase[phaseColumn(p)] {
						seenPhase[phaseColumn(p)] = true
						phases = append(phases, phaseColumn(p))
					}
				}
			}
		}
	}
	for _, r := range records {
		for _, p := range r.Phases {
			for _, s := range p.Steps {
				if !seenStep[string(s.Name)] {
					seenStep[string(s.Name)] = true
					steps = append(steps, string(s.Name))
				}
			}
		}
		for k := range r.Labels {
			seenLabel[k] = true
		}
	}
	return phases, steps, slices.Sorted(maps.Keys(seenLabel))
}
