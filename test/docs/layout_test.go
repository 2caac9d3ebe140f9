package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLayoutNamesEveryDirectory: the layout in docs/development.md names
// every directory of cmd/, pkg/, test/ and examples/, so a newcomer's map
// matches ls.
func TestLayoutNamesEveryDirectory(t *testing.T) {
	root := filepath.Join("..", "..")
	text, err := os.ReadFile(filepath.Join(root, "docs", "development.md"))
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(text), "```\n")
	end := strings.Index(string(text)[start+4:], "```")
	if start < 0 || end < 0 {
		t.Fatal("docs/development.md has no layout block")
	}
	layout := string(text)[start : start+4+end]
	for _, parent := range []string{"cmd", "pkg", "test", "examples"} {
		entries, err := os.ReadDir(filepath.Join(root, parent))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			if name := parent + "/" + e.Name(); !strings.Contains(layout, name) && !strings.Contains(layout, " "+e.Name()) {
				t.Errorf("docs/development.md's layout does not name %s", name)
			}
		}
	}
}

// TestNoFileOutgrowsAReader: no non-test Go file is longer than a newcomer
// reads at one sitting; a longer one is split by what its parts do.
func TestNoFileOutgrowsAReader(t *testing.T) {
	const maxLines = 500
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if n := strings.Count(string(text), "\n"); n > maxLines {
			t.Errorf("%s has %d lines, more than %d: split it by what its parts do", path, n, maxLines)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
