// Package treecopy copies a directory tree between two os.Roots, keeping
// modes, times and, where the caller may set them, owners. It is how an
// emptyDir's data gets into the target pod's volume, whether an init
// container or the kubectl-migrate runtime writes it. Both ends are
// os.Roots, so a symbolic link in either tree cannot lead the (root) copier
// out of it.
package treecopy

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"time"
)

// Copy copies the tree under from into to, returning the number of regular
// files copied. Sockets, pipes and devices are skipped; the top directory
// keeps to's own mode (it is a mount point).
func Copy(from, to *os.Root) (int, error) {
	files := 0
	type dirTimes struct {
		rel   string
		mtime time.Time
	}
	var dirs []dirTimes
	err := fs.WalkDir(from.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		switch {
		case mode.IsDir():
			if rel != "." {
				if err := to.Mkdir(rel, mode.Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
					return err
				}
			}
			dirs = append(dirs, dirTimes{rel, info.ModTime()})
		case mode&fs.ModeSymlink != 0:
			link, err := from.Readlink(rel)
			if err != nil {
				return err
			}
			if err := to.Symlink(link, rel); err != nil {
				return err
			}
		case mode.IsRegular():
			if err := copyFile(from, to, rel, mode.Perm()); err != nil {
				return err
			}
			_ = to.Chtimes(rel, info.ModTime(), info.ModTime())
			files++
		}
		if st, ok := ownerOf(info); ok {
			_ = to.Lchown(rel, st.uid, st.gid) // only root may; others own what they copy
		}
		if rel != "." && mode&fs.ModeSymlink == 0 { // the mount point keeps its own mode
			_ = to.Chmod(rel, mode.Perm())
		}
		return nil
	})
	// Directories' times last: filling them changed them.
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = to.Chtimes(dirs[i].rel, dirs[i].mtime, dirs[i].mtime)
	}
	return files, err
}

func copyFile(from, to *os.Root, rel string, perm fs.FileMode) error {
	in, err := from.Open(rel)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := to.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
