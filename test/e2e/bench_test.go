//go:build e2e

package e2e

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// BenchmarkStrategies migrates a live consumer (50 ms per message) at the
// paper's message rates with each strategy, alternating strategies within
// each round so both see the same machine load, and reports the medians of
// total migration time and downtime, and their ratios.
//
//	go test -tags e2e -run '^$' -bench Strategies -benchtime 1x ./test/e2e
func BenchmarkStrategies(b *testing.B) {
	const rounds = 3
	for _, rate := range []string{"4", "10"} {
		b.Run("rate="+rate, func(b *testing.B) {
			totals := map[string][]float64{}
			downs := map[string][]float64{}
			for i := 0; i < rounds; i++ {
				for _, strategy := range []string{"ms2m", "stop-and-copy"} {
					rec := benchMigrate(b, rate, strategy)
					totals[strategy] = append(totals[strategy], float64(rec.TotalMillis))
					downs[strategy] = append(downs[strategy], float64(rec.Downtime.Millis))
				}
			}
			for _, s := range []string{"ms2m", "stop-and-copy"} {
				b.ReportMetric(median(totals[s]), s+"-total-ms")
				b.ReportMetric(median(downs[s]), s+"-downtime-ms")
			}
			b.ReportMetric(median(totals["ms2m"])/median(totals["stop-and-copy"]), "total-ratio")
			b.ReportMetric(median(downs["ms2m"])/median(downs["stop-and-copy"]), "downtime-ratio")
			b.Logf("rate %s msg/s, %d rounds: totals %v, downtimes %v", rate, rounds, fmt.Sprint(totals), fmt.Sprint(downs))
		})
	}
}

// benchMigrate deploys a fresh workload at rate and migrates its consumer.
func benchMigrate(b *testing.B, rate, strategy string) report.Record {
	l := setup(b)
	w := l.deploy(b, rate)
	before := waitApplied(b, w, "consumer", 20)
	rec, stderr, err := l.migrate(b, w, "pod", "consumer", "--to", "node-b", "--strategy", strategy, "--label", "rate="+rate)
	if err != nil {
		b.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	l.checkMigrated(b, w, rec, before)
	checkTimings(b, rec)
	var phases []string
	for _, p := range rec.Phases {
		phases = append(phases, fmt.Sprintf("%s %d", p.Label(), p.DurationMillis))
	}
	b.Logf("%s at %s msg/s: total %d ms, downtime %d ms; phases (ms): %s", strategy, rate, rec.TotalMillis, rec.Downtime.Millis, strings.Join(phases, ", "))
	return rec
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkStatefulSetModes migrates ordinal 0 of a live 2-replica
// StatefulSet (10 msg/s, 50 ms per message) in sequential and shadow mode,
// alternating within each round, and reports the medians of total time and
// downtime (in shadow mode the sum of its two switchover gaps).
//
//	go test -tags e2e -run '^$' -bench StatefulSetModes -benchtime 1x ./test/e2e
func BenchmarkStatefulSetModes(b *testing.B) {
	const rounds = 3
	modes := []string{"sequential", "shadow"}
	totals, downs := map[string][]float64{}, map[string][]float64{}
	for i := 0; i < rounds; i++ {
		for _, mode := range modes {
			l := setup(b)
			w, _ := l.deployStatefulSet(b)
			waitApplied(b, w, "consumer-0", 30)
			rec, stderr, err := l.migrate(b, w, "sts", "consumer-0", "--to", "node-b", "--queue", w.Queue, "--mode", mode)
			if err != nil {
				b.Fatalf("migration failed: %v\n%s", err, stderr)
			}
			checkConservation(b, w, "consumer-0")
			totals[mode] = append(totals[mode], float64(rec.TotalMillis))
			downs[mode] = append(downs[mode], float64(rec.Downtime.Millis))
		}
	}
	for _, m := range modes {
		b.ReportMetric(median(totals[m]), m+"-total-ms")
		b.ReportMetric(median(downs[m]), m+"-downtime-ms")
	}
	b.ReportMetric(median(downs["shadow"])/median(downs["sequential"]), "downtime-ratio")
	b.ReportMetric(median(totals["shadow"])/median(totals["sequential"]), "total-ratio")
	b.Logf("%d rounds: totals %v, downtimes %v", rounds, fmt.Sprint(totals), fmt.Sprint(downs))
}
