package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// headline is the README's one sentence of figures, copied from the
// generated evaluation summary.
var headline = regexp.MustCompile(`at\s+(\d+) msg/s .*?downtime \*\*([^*]+)\*\* with MS2M against \*\*([^*]+)\*\*\s+with stop-and-copy, and \*\*([^*]+)\*\* for a StatefulSet pod in shadow mode`)

// TestReadmeHeadlineIsTheEvaluations: the README's headline figures are the
// medians docs/eval/summary.md (written by make eval) gives for that rate,
// so a new evaluation cannot leave the README quoting an old one.
func TestReadmeHeadlineIsTheEvaluations(t *testing.T) {
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := headline.FindStringSubmatch(strings.Join(strings.Fields(string(readme)), " "))
	if m == nil {
		t.Fatal("README.md has no headline sentence of figures (at N msg/s … downtime **X** with MS2M against **Y** with stop-and-copy, and **Z** for a StatefulSet pod in shadow mode)")
	}
	summary, err := os.ReadFile(filepath.Join(root, "docs", "eval", "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	downtime := map[string]string{} // strategy → median downtime at the headline's rate
	for _, line := range strings.Split(string(summary), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 7 || strings.TrimSpace(cells[1]) != m[1] {
			continue
		}
		downtime[strings.TrimSpace(cells[2])] = strings.TrimSpace(cells[5])
	}
	for strategy, quoted := range map[string]string{"ms2m": m[2], "stop-and-copy": m[3], "sts-shadow": m[4]} {
		if downtime[strategy] != quoted {
			t.Errorf("README quotes %s downtime %q at %s msg/s; docs/eval/summary.md says %q", strategy, quoted, m[1], downtime[strategy])
		}
	}
}
