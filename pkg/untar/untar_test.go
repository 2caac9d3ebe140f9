package untar

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type entry struct {
	name, link string
	typ        byte
	body       string
}

func stream(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(e.body))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

// TestNothingLeavesTheDirectory: a "../" name, an absolute one, and a file
// written through a link planted earlier in the stream all stay inside.
func TestNothingLeavesTheDirectory(t *testing.T) {
	outside := t.TempDir()
	dir := t.TempDir()
	for _, s := range []*bytes.Buffer{
		stream(t, entry{name: "../escape", typ: tar.TypeReg, body: "x"}),
		stream(t, entry{name: "link", link: outside, typ: tar.TypeSymlink}, entry{name: "link/escape", typ: tar.TypeReg, body: "x"}),
	} {
		_, _ = Extract(s, dir, Options{})
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Fatalf("written outside: %v", entries)
	}
	if _, err := Extract(stream(t, entry{name: "/abs/file", typ: tar.TypeReg, body: "in"}), dir, Options{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "abs", "file")); err != nil || string(b) != "in" {
		t.Fatalf("an absolute name lands inside: %q %v", b, err)
	}
}

func TestBoundAndLayers(t *testing.T) {
	dir := t.TempDir()
	if _, err := Extract(stream(t, entry{name: "big", typ: tar.TypeReg, body: strings.Repeat("x", 100)}), dir, Options{MaxBytes: 10}); err == nil {
		t.Fatal("a stream over MaxBytes was written")
	}
	// A layer deletes with whiteouts and may come gzipped.
	for _, f := range []string{"etc/gone", "var/cache/a", "var/cache/b"} {
		_ = os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)
		_ = os.WriteFile(filepath.Join(dir, f), []byte("old"), 0o644)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(stream(t,
		entry{name: "etc/.wh.gone", typ: tar.TypeReg},
		entry{name: "var/cache/", typ: tar.TypeDir},
		entry{name: "var/cache/.wh..wh..opq", typ: tar.TypeReg},
		entry{name: "var/cache/new", typ: tar.TypeReg, body: "new"},
	).Bytes())
	_ = zw.Close()
	r, err := Gunzipped(&gz)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Extract(r, dir, Options{Whiteouts: true})
	if err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(filepath.Join(dir, "var", "cache"))
	if _, err := os.Stat(filepath.Join(dir, "etc", "gone")); !os.IsNotExist(err) || len(left) != 1 || left[0].Name() != "new" || st.Files != 1 {
		t.Fatalf("after the layer: etc/gone %v, var/cache %v, %+v", err, left, st)
	}
}
