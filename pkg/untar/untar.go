// Package untar writes a tar stream into a directory through os.Root, so
// that no entry of the stream (a "../" name, a link planted earlier in the
// stream) reaches outside it: both of its callers run as root on a node and
// read archives that hold what a container wrote.
package untar

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"
)

// Options bound an extraction.
type Options struct {
	// MaxBytes bounds the bytes of regular files written; 0 means no bound.
	MaxBytes int64
	// Owners sets each entry's owner from the stream (root may; a process
	// that may not gets an error).
	Owners bool
	// Whiteouts reads the stream as an OCI image layer: .wh.NAME removes
	// NAME, .wh..wh..opq empties its directory.
	Whiteouts bool
}

// Gunzipped is r, decompressed if it is gzip (an image layer may be).
func Gunzipped(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		return gzip.NewReader(br)
	}
	return br, nil
}

// Stats is what an extraction wrote.
type Stats struct {
	Files int
	Bytes int64
}

// Extract writes every entry of r under dir, which must exist. Regular
// files, directories, symbolic and hard links are written, with their modes
// and times; other entries (devices, pipes) are skipped: a container's
// changes to its root filesystem and a checkpoint hold none that matter.
func Extract(r io.Reader, dir string, opts Options) (Stats, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Stats{}, err
	}
	defer root.Close()
	var st Stats
	type dirTime struct {
		name  string
		mtime time.Time
	}
	var dirs []dirTime
	buf := make([]byte, 1<<20)
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, err
		}
		name := path.Clean(h.Name)
		if name == "." || name == "/" {
			continue
		}
		if path.IsAbs(name) {
			name = name[1:]
		}
		if dirOf := path.Dir(name); dirOf != "." {
			if err := root.MkdirAll(dirOf, 0o755); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
		}
		if base := path.Base(name); opts.Whiteouts && strings.HasPrefix(base, whiteoutPrefix) {
			if err := whiteout(root, path.Dir(name), strings.TrimPrefix(base, whiteoutPrefix)); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			continue
		}
		mode := fs.FileMode(h.Mode).Perm() | fs.FileMode(h.Mode)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, mode); err != nil && !errors.Is(err, fs.ErrExist) {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			dirs = append(dirs, dirTime{name, h.ModTime})
		case tar.TypeReg:
			if opts.MaxBytes > 0 && st.Bytes+h.Size > opts.MaxBytes {
				return st, fmt.Errorf("%s: the archive holds more than %d bytes", h.Name, opts.MaxBytes)
			}
			if err := replace(root, name); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
			if err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			n, err := io.CopyBuffer(struct{ io.Writer }{f}, tr, buf)
			if closeErr := f.Close(); err == nil {
				err = closeErr
			}
			st.Bytes += n
			if err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			st.Files++
		case tar.TypeSymlink:
			if err := replace(root, name); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			if err := root.Symlink(h.Linkname, name); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeLink:
			if err := replace(root, name); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			if err := root.Link(path.Clean(h.Linkname), name); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			continue // its target's mode, owner and times are the file's
		default:
			continue
		}
		if opts.Owners {
			if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
		}
		if h.Typeflag != tar.TypeSymlink {
			// After the owner: chown clears the set-id bits.
			if err := root.Chmod(name, mode); err != nil {
				return st, fmt.Errorf("%s: %w", h.Name, err)
			}
			_ = root.Chtimes(name, h.ModTime, h.ModTime)
		}
	}
	// Directories' times last: filling them changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = root.Chtimes(dirs[i].name, dirs[i].mtime, dirs[i].mtime)
	}
	return st, nil
}

const (
	whiteoutPrefix = ".wh."
	opaque         = ".wh..opq" // after the prefix
)

// whiteout applies a layer's deletion of name in dir, or of all dir held
// (opaque).
func whiteout(root *os.Root, dir, name string) error {
	if name != opaque {
		err := root.RemoveAll(path.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	f, err := root.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	entries, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := root.RemoveAll(path.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// replace removes what is at name unless it is a directory, as a later
// entry of a stream replaces an earlier one (and a container's change
// replaces its image's file).
func replace(root *os.Root, name string) error {
	info, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if info.IsDir() {
		return fmt.Errorf("a directory is in the way")
	}
	return root.Remove(name)
}
