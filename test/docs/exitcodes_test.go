package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/plugin"
)

// TestReadmeListsEveryExitCode: README's exit-code table has a row for
// each code a command exits with, and no other.
func TestReadmeListsEveryExitCode(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(text), "**Exit codes**")
	if !ok {
		t.Fatal("README has no **Exit codes** table")
	}
	table, _, _ = strings.Cut(table, "\n\n#")
	var listed []int
	for _, m := range regexp.MustCompile(`(?m)^\| (\d+) \|`).FindAllStringSubmatch(table, -1) {
		code, _ := strconv.Atoi(m[1])
		listed = append(listed, code)
	}
	want := slices.Sorted(slices.Values(plugin.ExitCodes))
	if slices.Sort(listed); !slices.Equal(listed, want) {
		t.Fatalf("README lists exit codes %v; the commands exit with %v", listed, want)
	}
}
