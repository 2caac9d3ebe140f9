//go:build unix

package treecopy

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestCopyKeepsTheTree: files, directories and links arrive with their
// modes and times; a link is copied as a link (never followed out of the
// tree), a pipe is skipped; the top directory keeps its own mode.
func TestCopyKeepsTheTree(t *testing.T) {
	from, to := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(from, "sub"), 0o750))
	must(os.WriteFile(filepath.Join(from, "ledger"), []byte("1\n2\n"), 0o640))
	must(os.WriteFile(filepath.Join(from, "sub", "part"), []byte("p"), 0o600))
	must(os.Symlink("/etc/passwd", filepath.Join(from, "escape")))
	must(syscall.Mkfifo(filepath.Join(from, "pipe"), 0o600))
	old := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	must(os.Chtimes(filepath.Join(from, "ledger"), old, old))
	must(os.Chmod(to, 0o777))

	src, err := os.OpenRoot(from)
	must(err)
	defer src.Close()
	dst, err := os.OpenRoot(to)
	must(err)
	defer dst.Close()
	files, err := Copy(src, dst)
	if err != nil || files != 2 {
		t.Fatalf("copied %d files, %v; want 2", files, err)
	}
	for rel, want := range map[string]string{"ledger": "1\n2\n", "sub/part": "p"} {
		if b, err := os.ReadFile(filepath.Join(to, rel)); err != nil || string(b) != want {
			t.Errorf("%s: %q, %v", rel, b, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(to, "ledger")); err != nil || fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(old) {
		t.Errorf("ledger: %v, %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(to, "sub")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("sub: %v, %v", fi, err)
	}
	if link, err := os.Readlink(filepath.Join(to, "escape")); err != nil || link != "/etc/passwd" {
		t.Errorf("the link: %q, %v", link, err)
	}
	if _, err := os.Lstat(filepath.Join(to, "pipe")); !os.IsNotExist(err) {
		t.Errorf("the pipe was copied: %v", err)
	}
	if fi, err := os.Stat(to); err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("the top directory's mode changed: %v, %v", fi, err)
	}
}
