//go:build e2e

package e2e

import (
	"cmp"
	"context"
	cryptorand "crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// BenchmarkStrategies migrates a live consumer (50 ms per message, μ ≈ 20/s)
// at the paper's message rates with each strategy, alternating strategies
// within each round so all see the same machine load, and reports the
// medians of total time, downtime, the critical path (checkpoint → restored
// copy holding) and our own overhead on it, and the ratios to
// stop-and-copy. At 16 msg/s MS2M also runs with the threshold cutoff;
// at 10 msg/s also with the direct (registry-less) transfer.
//
//	go test -tags e2e -run '^$' -bench Strategies -benchtime 1x ./test/e2e
//
// For the evaluation (make eval), E2E_EVAL_RUNS sets the runs per cell and
// E2E_EVAL_DIR where every run's record goes, as runs.csv; the evaluation
// adds, at every rate, the StatefulSet variants (ordinal 0 of a 2-replica
// StatefulSet: sequential MS2M, sequential stop-and-copy, shadow) and the
// cutoff, and 24 msg/s (above μ) where plain MS2M must roll back early
// because replay cannot catch up, and the cutoff must succeed. A progress
// line with an ETA goes to stderr after each run. E2E_EVAL_QUICK=1 (make
// eval-quick, in .ci/run) keeps one rate, 10 msg/s, and the three pod
// strategies: MS2M, MS2M with the cutoff, stop-and-copy.
func BenchmarkStrategies(b *testing.B) {
	rounds := evalRounds(3)
	var all []*report.Record
	defer func() {
		if dir := os.Getenv("E2E_EVAL_DIR"); dir != "" {
			writeRuns(b, dir, all)
		}
	}()
	quick := os.Getenv("E2E_EVAL_QUICK") == "1"
	full := os.Getenv("E2E_EVAL_DIR") != "" && !quick
	rates := []string{"4", "10", "16"}
	cells := map[string][]string{}
	for _, rate := range rates {
		names := []string{"ms2m", "stop-and-copy"}
		switch {
		case quick:
			names = append(names, "cutoff")
		case full:
			names = append(names, "cutoff", "sts-sequential", "sts-stop-and-copy", "sts-shadow")
		case rate == "10":
			names = append(names, "direct")
		case rate == "16":
			names = append(names, "cutoff")
		}
		cells[rate] = names
	}
	if quick {
		rates = []string{"10"}
	}
	if full {
		rates = append(rates, "24")
		cells["24"] = []string{"ms2m", "cutoff"}
	}
	progress := newEvalProgress(rates, cells, rounds)
	for _, rate := range rates {
		b.Run("rate="+rate, func(b *testing.B) {
			names := cells[rate]
			figures := map[string]map[string][]float64{}
			for i := 0; i < rounds; i++ {
				for _, name := range names {
					rec := benchVariant(b, rate, name)
					progress.ran(rate, name, rec)
					all = append(all, &rec)
					if figures[name] == nil {
						figures[name] = map[string][]float64{}
					}
					if rec.Outcome != report.Succeeded || rec.Downtime == nil {
						continue
					}
					for metric, v := range map[string]int64{
						"total": rec.TotalMillis, "downtime": rec.Downtime.Millis,
						"critical-path": rec.CriticalPathMillis(), "overhead": rec.OverheadMillis(),
					} {
						figures[name][metric] = append(figures[name][metric], float64(v))
					}
				}
			}
			for _, name := range names {
				for _, metric := range []string{"total", "downtime", "critical-path", "overhead"} {
					if v := figures[name][metric]; len(v) > 0 {
						b.ReportMetric(median(v), name+"-"+metric+"-ms")
					}
				}
			}
			ratio := func(a, c map[string][]float64, metric, unit string) {
				if len(a[metric]) > 0 && len(c[metric]) > 0 {
					b.ReportMetric(median(a[metric])/median(c[metric]), unit)
				}
			}
			ms2m, sc := figures["ms2m"], figures["stop-and-copy"]
			ratio(ms2m, sc, "total", "ms2m/stop-and-copy-total-ratio")
			ratio(ms2m, sc, "downtime", "ms2m/stop-and-copy-downtime-ratio")
			ratio(figures["cutoff"], ms2m, "total", "cutoff/ms2m-total-ratio")
			ratio(figures["direct"], ms2m, "critical-path", "direct/registry-critical-path-ratio")
			ratio(figures["sts-sequential"], figures["sts-stop-and-copy"], "downtime", "sts-sequential/sts-stop-and-copy-downtime-ratio")
			b.Logf("rate %s msg/s, %d rounds: %v", rate, rounds, fmt.Sprint(figures))
		})
	}
}

// evalProgress draws a progress bar with an ETA, on stderr, as the
// evaluation's runs end.
type evalProgress struct {
	start       time.Time
	done, total int
}

func newEvalProgress(rates []string, cells map[string][]string, rounds int) *evalProgress {
	p := &evalProgress{start: time.Now()}
	for _, rate := range rates {
		p.total += len(cells[rate]) * rounds
	}
	return p
}

func (p *evalProgress) ran(rate, variant string, rec report.Record) {
	p.done++
	elapsed := time.Since(p.start)
	eta := time.Duration(float64(elapsed) / float64(p.done) * float64(p.total-p.done))
	const width = 30
	filled := width * p.done / p.total
	fmt.Fprintf(os.Stderr, "eval [%s%s] %d/%d · %s at %s msg/s %s in %s · elapsed %s · ETA %s\n",
		strings.Repeat("#", filled), strings.Repeat("-", width-filled), p.done, p.total,
		variant, rate, rec.Outcome, time.Duration(rec.TotalMillis)*time.Millisecond,
		elapsed.Round(time.Second), eta.Round(time.Second))
}

// benchVariant runs one migration of a variant at rate on a fresh workload
// and returns its record. MS2M above μ (24 msg/s) must roll back, early,
// with the source serving and every message kept; everything else must
// succeed.
func benchVariant(b *testing.B, rate, variant string) report.Record {
	flags := map[string][]string{
		"ms2m":              {"--strategy", "ms2m"},
		"stop-and-copy":     {"--strategy", "stop-and-copy"},
		"cutoff":            {"--strategy", "ms2m", "--replay-max", "4s"},
		"direct":            {"--strategy", "ms2m", "--transfer", "direct"},
		"sts-sequential":    {"--strategy", "ms2m"},
		"sts-stop-and-copy": {"--strategy", "stop-and-copy"},
		"sts-shadow":        {"--mode", "shadow"},
	}[variant]
	labels := []string{"--label", "rate=" + rate, "--label", "variant=" + variant}
	if strings.HasPrefix(variant, "sts-") {
		l := setup(b)
		w, _ := l.deployStatefulSetAt(b, rate)
		waitApplied(b, w, "consumer-0", 20)
		rec, stderr, err := l.migrate(b, w, append(append([]string{"sts", "consumer-0", "--to", "node-b", "--queue", w.Queue}, labels...), flags...)...)
		if err != nil && !keptRollback(b, w, "consumer-0", rec) {
			b.Fatalf("%s at %s msg/s failed: %v\n%s", variant, rate, err, stderr)
		}
		checkConservation(b, w, "consumer-0")
		return rec
	}
	if variant == "ms2m" && rate == "24" {
		l := setup(b)
		w := l.deploy(b, rate)
		waitApplied(b, w, "consumer", 20)
		rec, stderr, err := l.migrate(b, w, append(append([]string{"pod", "consumer", "--to", "node-b"}, labels...), flags...)...)
		if err == nil || rec.Outcome != report.RolledBack || !strings.Contains(rec.Error, "--replay-max") {
			b.Fatalf("MS2M above μ: outcome %s (%v), want rolled back naming --replay-max\n%s", rec.Outcome, err, stderr)
		}
		checkConservation(b, w, "consumer")
		return rec
	}
	return benchMigrate(b, rate, variant, flags...)
}

// BenchmarkStateSize migrates a consumer holding about 2 MiB, 64 MiB and
// 512 MiB of state, through the registry and directly, side by side, and
// reports the critical path and each data step's throughput; as baselines
// it uploads the same number of bytes to the same registry as one plain
// blob, and sends them over one plain TCP connection from node-a's network
// to node-b's, in the same run.
//
//	go test -tags e2e -run '^$' -bench StateSize -benchtime 1x ./test/e2e
func BenchmarkStateSize(b *testing.B) {
	for _, ballast := range []string{"", "64Mi", "512Mi"} {
		name := ballast
		if name == "" {
			name = "none"
		}
		b.Run("ballast="+name, func(b *testing.B) {
			var archive int64
			sent := map[string]float64{} // each transfer's push or stream, ms
			for _, transfer := range []string{"registry", "direct"} {
				l := setup(b)
				w := l.deployWith(b, workload.Options{Rate: "10", Ballast: ballast})
				before := waitApplied(b, w, "consumer", 20)
				rec, stderr, err := l.migrate(b, w, "pod", "consumer", "--to", "node-b", "--transfer", transfer)
				if err != nil {
					b.Fatalf("migration failed: %v\n%s", err, stderr)
				}
				l.checkMigrated(b, w, rec, before)
				archive = rec.ArchiveBytes
				b.ReportMetric(float64(rec.CriticalPathMillis()), transfer+"-critical-path-ms")
				b.ReportMetric(float64(rec.OverheadMillis()), transfer+"-overhead-ms")
				for _, p := range rec.Phases {
					for _, st := range p.Steps {
						if st.Name == report.Push {
							sent[transfer] += float64(st.DurationMillis)
						}
						if st.Name == report.Push || st.Name == report.CheckpointCall || st.Name == report.PodRunning || st.Name == report.StagedRunning {
							b.ReportMetric(float64(st.DurationMillis), transfer+"-"+strings.ReplaceAll(string(st.Name), " ", "-")+"-ms")
						}
					}
				}
				b.Logf("%s, %d KiB: %s", transfer, rec.ArchiveBytes>>10, stepSummary(rec))
			}
			took, err := rawUpload(b, setup(b).registry, archive)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(took.Milliseconds()), "raw-upload-ms")
			b.ReportMetric(sent["registry"]/max(1, float64(took.Milliseconds())), "push/raw-upload")
			if took, err = rawNodeCopy(archive); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(took.Milliseconds()), "raw-node-copy-ms")
			if took, err = fileNodeCopy(env(b, "LAB_RUN"), archive); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(took.Milliseconds()), "file-node-copy-ms")
			b.ReportMetric(sent["direct"]/max(1, float64(took.Milliseconds())), "stream/file-node-copy")
			b.ReportMetric(float64(archive>>20), "archive-MiB")
		})
	}
}

// writeRuns writes records to dir/runs.csv (report.WriteCSV), every run.
func writeRuns(b *testing.B, dir string, records []*report.Record) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "runs.csv"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := report.WriteCSV(f, records); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d runs in %s", len(records), f.Name())
}

// rawUpload pushes size random bytes to the registry as one blob: what the
// checkpoint's push costs without anything of ours around it.
func rawUpload(b *testing.B, registry string, size int64) (time.Duration, error) {
	data := make([]byte, size)
	_, _ = cryptorand.Read(data)
	layer := static.NewLayer(data, types.OCILayer)
	repo, err := name.NewRepository(registry+"/bench/raw", name.Insecure)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	err = remote.WriteLayer(repo, layer)
	return time.Since(t0), err
}

// stepSummary lists a record's phases and steps with their durations.
func stepSummary(rec report.Record) string {
	var parts []string
	for _, p := range rec.Phases {
		part := fmt.Sprintf("%s %d", p.Label(), p.DurationMillis)
		for _, st := range p.Steps {
			part += fmt.Sprintf(" [%s %d]", st.Name, st.DurationMillis)
		}
		parts = append(parts, part)
	}
	return fmt.Sprintf("total %d ms, critical path %d ms (ours %d ms); %s", rec.TotalMillis, rec.CriticalPathMillis(), rec.OverheadMillis(), strings.Join(parts, ", "))
}

// stepFigures adds to figures, under key+"-"+name, the duration of each
// step of rec that names lists (step → name).
func stepFigures(figures map[string][]float64, key string, rec report.Record, names map[report.StepName]string) {
	for _, p := range rec.Phases {
		for _, st := range p.Steps {
			if name, ok := names[st.Name]; ok {
				figures[key+"-"+name] = append(figures[key+"-"+name], float64(st.DurationMillis))
			}
		}
	}
}

// keptRollback reports whether a failed migration is one of the
// evaluation's runs to keep: in the full evaluation (not its quick mode, not
// make bench) a migration that rolled back cleanly is an outcome the CSV
// records — e.g. shadow mode at 16 msg/s when the shared machine slows μ to
// λ — rather than the end of its cell; its caller still checks that the
// source serves every message. Anything else is a failure.
func keptRollback(b *testing.B, w *workload.Workload, pod string, rec report.Record) bool {
	if os.Getenv("E2E_EVAL_DIR") == "" || os.Getenv("E2E_EVAL_QUICK") == "1" || rec.Outcome != report.RolledBack {
		return false
	}
	if st := state(b, w, pod); st.Mode != protocol.ModePrimary {
		b.Fatalf("%s not serving after the rollback: %+v", pod, st)
	}
	b.Logf("kept: %s rolled back (%s)", rec.ID, rec.Error)
	return true
}

// benchMigrate deploys a fresh workload at rate and migrates its consumer.
func benchMigrate(b *testing.B, rate, label string, flags ...string) report.Record {
	l := setup(b)
	w := l.deploy(b, rate)
	before := waitApplied(b, w, "consumer", 20)
	args := append([]string{"pod", "consumer", "--to", "node-b", "--label", "rate=" + rate, "--label", "variant=" + label}, flags...)
	rec, stderr, err := l.migrate(b, w, args...)
	if err != nil && keptRollback(b, w, "consumer", rec) {
		checkConservation(b, w, "consumer")
		return rec
	}
	if err != nil {
		b.Fatalf("migration failed: %v\n%s", err, stderr)
	}
	l.checkMigrated(b, w, rec, before)
	checkTimings(b, rec)
	b.Logf("%s at %s msg/s: downtime %d ms; %s", label, rate, rec.Downtime.Millis, stepSummary(rec))
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

// BenchmarkRestorePaths compares, side by side in one run, the restore
// through the container runtime (a checkpoint image through the registry,
// and through the direct transfer) with the kubectl-migrate runtime's (the
// archive staged on the node, no image), each as MS2M and as stop-and-copy
// at 10 msg/s, alternating within each of E2E_EVAL_RUNS rounds (default 5),
// and reports the medians of the critical path and the downtime, and the
// runtime's ratio to each. node-setup installs the runtime first and
// removes it at the end. E2E_PATHS (e.g. "runtime,direct") runs only those
// paths.
//
//	go test -tags e2e -run '^$' -bench RestorePaths -benchtime 1x ./test/e2e
func BenchmarkRestorePaths(b *testing.B) {
	rounds := evalRounds(5)
	l := setup(b)
	l.setUpRuntime(b)
	paths := map[string][]string{
		"registry": {"--restore", "cri"},
		"direct":   {"--restore", "cri", "--transfer", "direct"},
		"runtime":  {"--restore", "runtime"},
	}
	names := []string{"registry", "direct", "runtime"}
	if v := os.Getenv("E2E_PATHS"); v != "" {
		names = strings.Split(v, ",")
	}
	figures := map[string][]float64{}
	for i := 0; i < rounds; i++ {
		for _, strategy := range []string{"ms2m", "stop-and-copy"} {
			for _, name := range names {
				rec := benchMigrate(b, "10", name+"-"+strategy, append([]string{"--strategy", strategy}, paths[name]...)...)
				if rec.Outcome != report.Succeeded || rec.Downtime == nil {
					continue
				}
				key := name + "-" + strategy
				figures[key+"-critical-path"] = append(figures[key+"-critical-path"], float64(rec.CriticalPathMillis()))
				figures[key+"-downtime"] = append(figures[key+"-downtime"], float64(rec.Downtime.Millis))
			}
		}
	}
	for _, strategy := range []string{"ms2m", "stop-and-copy"} {
		for _, name := range names {
			for _, metric := range []string{"critical-path", "downtime"} {
				if v := figures[name+"-"+strategy+"-"+metric]; len(v) > 0 {
					b.ReportMetric(median(v), name+"-"+strategy+"-"+metric+"-ms")
				}
			}
		}
		for _, other := range []string{"registry", "direct"} {
			for _, metric := range []string{"critical-path", "downtime"} {
				r, o := figures["runtime-"+strategy+"-"+metric], figures[other+"-"+strategy+"-"+metric]
				if len(r) > 0 && len(o) > 0 {
					b.ReportMetric(median(r)/median(o), "runtime/"+other+"-"+strategy+"-"+metric+"-ratio")
				}
			}
		}
	}
}

// evalRounds is E2E_EVAL_RUNS, or def where it is not set.
func evalRounds(def int) int {
	if n, err := strconv.Atoi(os.Getenv("E2E_EVAL_RUNS")); err == nil && n > 0 {
		return n
	}
	return def
}

// restorePaths are the flags of the two restore paths the size benchmarks
// compare, both without a registry.
var restorePaths = map[string][]string{
	"cri":     {"--restore", "cri", "--transfer", "direct"},
	"runtime": {"--restore", "runtime"},
}

// BenchmarkRestoreAtSize migrates a consumer holding E2E_BALLAST of state
// (default 512Mi) at 10 msg/s through the kubectl-migrate runtime and, side
// by side, through the container runtime's restore (direct transfer),
// alternating within each of E2E_EVAL_RUNS rounds (default 5). It sets the
// runtime's critical path against its floor: a plain copy of a file the
// archive's size from node-a's disk to node-b's (fileNodeCopy, each round)
// plus the restore itself, the staged → running step (CRIU's restore as the
// runtime runs it; CRIU alone is not timed apart). Each consumer is deleted
// after its run, so only one holds its state at a time.
//
//	go test -tags e2e -run '^$' -bench RestoreAtSize -benchtime 1x ./test/e2e
func BenchmarkRestoreAtSize(b *testing.B) {
	rounds, ballast := evalRounds(5), cmp.Or(os.Getenv("E2E_BALLAST"), "512Mi")
	l := setup(b)
	l.setUpRuntime(b)
	figures := map[string][]float64{}
	var archive int64
	for i := 0; i < rounds; i++ {
		for _, path := range []string{"cri", "runtime"} {
			w := l.deployWith(b, workload.Options{Rate: "10", Ballast: ballast})
			before := waitApplied(b, w, "consumer", 20)
			args := append([]string{"pod", "consumer", "--to", "node-b", "--label", "variant=" + path + "-" + ballast}, restorePaths[path]...)
			rec, stderr, err := l.migrate(b, w, args...)
			if err != nil {
				b.Fatalf("%s migration failed: %v\n%s", path, err, stderr)
			}
			l.checkMigrated(b, w, rec, before)
			checkConservation(b, w, rec.TargetPod)
			archive = rec.ArchiveBytes
			figures[path+"-critical-path"] = append(figures[path+"-critical-path"], float64(rec.CriticalPathMillis()))
			for _, p := range rec.Phases {
				for _, st := range p.Steps {
					if st.Name == report.StagedRunning || st.Name == report.PodRunning {
						figures[path+"-restore"] = append(figures[path+"-restore"], float64(st.DurationMillis))
					}
					if st.Name == report.CheckpointCall {
						figures[path+"-checkpoint-call"] = append(figures[path+"-checkpoint-call"], float64(st.DurationMillis))
					}
				}
			}
			b.Logf("%s, %d MiB: %s", path, rec.ArchiveBytes>>20, stepSummary(rec))
			if err := w.Delete(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		took, err := fileNodeCopy(env(b, "LAB_RUN"), archive)
		if err != nil {
			b.Fatal(err)
		}
		figures["file-node-copy"] = append(figures["file-node-copy"], float64(took.Milliseconds()))
	}
	for _, name := range []string{"cri-critical-path", "runtime-critical-path", "cri-restore", "runtime-restore", "runtime-checkpoint-call", "file-node-copy"} {
		b.ReportMetric(median(figures[name]), name+"-ms")
	}
	floor := median(figures["file-node-copy"]) + median(figures["runtime-restore"])
	b.ReportMetric(median(figures["runtime-critical-path"])/floor, "runtime-critical-path/(file-copy+restore)-ratio")
	// The kubelet's checkpoint call (CRIU's dump, then the runtime writing
	// the archive) is on every critical path and outside the floor: this is
	// the ratio a transfer that took no time at all would reach.
	b.ReportMetric((median(figures["runtime-checkpoint-call"])+median(figures["runtime-restore"]))/floor, "runtime-(checkpoint-call+restore)/(file-copy+restore)-ratio")
	b.ReportMetric(median(figures["runtime-critical-path"])/median(figures["cri-critical-path"]), "runtime/cri-critical-path-ratio")
	b.ReportMetric(float64(archive>>20), "archive-MiB")
}
