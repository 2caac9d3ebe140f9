package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/treecopy"
)

// VolumesKey names a migration's emptyDir snapshot among its checkpoint
// archives, images and staged checkpoints, beside the containers' names.
const VolumesKey = ociruntime.VolumesKey

// PodsDir is where the kubelet keeps each pod's volumes.
const PodsDir = "/var/lib/kubelet/pods"

// podsDir is PodsDir; tests point it at a temporary directory.
var podsDir = PodsDir

// SnapshotRequest asks for the contents of a pod's emptyDir volumes as one
// tar (their files under image.VolumesRoot/NAME/), to Archive, or with no
// Archive only their size.
type SnapshotRequest struct {
	PodUID   string   `json:"podUID"`
	Volumes  []string `json:"volumes"`
	Archive  string   `json:"archive,omitempty"`
	MaxBytes int64    `json:"maxBytes"`
}

// SnapshotResult is what a snapshot holds.
type SnapshotResult struct {
	Archive string `json:"archive,omitempty"`
	Bytes   int64  `json:"bytes"` // the files' contents
	Files   int    `json:"files"`
	// Skipped names what no snapshot carries (sockets, pipes, devices: the
	// restored process makes its own again).
	Skipped []string `json:"skipped,omitempty"`
}

var (
	podUID     = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	volumeName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
)

// ErrTooLarge is a snapshot over its MaxBytes.
var ErrTooLarge = errors.New("emptyDir data over the limit")

// SnapshotVolumes writes the snapshot. It reads the volumes through os.Root,
// so a symbolic link the pod planted cannot make this root process read
// anything outside them: the agent runs as root and must not be talked into
// reading another pod's files.
func SnapshotVolumes(req SnapshotRequest, namespace string) (res SnapshotResult, err error) {
	if !podUID.MatchString(req.PodUID) {
		return res, fmt.Errorf("pod UID %q is not a UID", req.PodUID)
	}
	var tw *tar.Writer
	if req.Archive != "" {
		if err := ValidateArchive(req.Archive); err != nil {
			return res, err
		}
		f, openErr := os.OpenFile(req.Archive, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if openErr != nil {
			return res, openErr
		}
		defer func() {
			if closeErr := f.Close(); err == nil {
				err = closeErr
			}
			if err != nil {
				_ = os.Remove(req.Archive)
			}
		}()
		tw = tar.NewWriter(f)
		res.Archive = req.Archive
		if err := tw.WriteHeader(&tar.Header{Name: NamespaceEntry, Mode: 0o600, Size: int64(len(namespace)), Typeflag: tar.TypeReg}); err != nil {
			return res, err
		}
		if _, err := tw.Write([]byte(namespace)); err != nil {
			return res, err
		}
	}
	for _, name := range req.Volumes {
		if !volumeName.MatchString(name) {
			return res, fmt.Errorf("volume name %q is not a DNS label", name)
		}
		dir := filepath.Join(podsDir, req.PodUID, "volumes", "kubernetes.io~empty-dir", name)
		if err := snapshotVolume(dir, name, tw, req.MaxBytes, &res); err != nil {
			return res, err
		}
	}
	if tw != nil {
		return res, tw.Close()
	}
	return res, nil
}

func snapshotVolume(dir, name string, tw *tar.Writer, maxBytes int64, res *SnapshotResult) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("emptyDir %s: %w", name, err)
	}
	defer root.Close()
	prefix := strings.TrimPrefix(image.VolumesRoot, "/") + "/" + name
	return fs.WalkDir(root.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch mode := info.Mode(); {
		case mode.IsRegular(), mode.IsDir():
		case mode&fs.ModeSymlink != 0:
			if link, err = root.Readlink(rel); err != nil {
				return err
			}
		default:
			res.Skipped = append(res.Skipped, name+"/"+rel)
			return nil
		}
		if info.Mode().IsRegular() {
			res.Bytes += info.Size()
			res.Files++
			if maxBytes > 0 && res.Bytes > maxBytes {
				return fmt.Errorf("%w: emptyDir %s holds more than %d bytes", ErrTooLarge, name, maxBytes)
			}
		}
		if tw == nil {
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = path.Join(prefix, rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := root.Open(rel)
		if err != nil {
			return err
		}
		defer f.Close()
		// The header's size is the file's when listed: a file that grew
		// since (the application runs) is cut there, one that shrank fails.
		_, err = io.CopyN(tw, f, hdr.Size)
		return err
	})
}

// FillVolumes copies each snapshot directory under src (image.VolumesRoot in
// the volume image) into the directory of the same name under dst, where
// the target pod's emptyDir is mounted, keeping modes and times, and owners
// where the copy may set them. It runs in the target pod's init container.
func FillVolumes(src, dst string) (string, error) {
	entries, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	files := 0
	for _, e := range entries {
		from, err := os.OpenRoot(filepath.Join(src, e.Name()))
		if err != nil {
			return "", err
		}
		to, err := os.OpenRoot(filepath.Join(dst, e.Name()))
		if err != nil {
			from.Close()
			return "", fmt.Errorf("emptyDir %s is not mounted at %s: %w", e.Name(), filepath.Join(dst, e.Name()), err)
		}
		n, err := treecopy.Copy(from, to)
		from.Close()
		to.Close()
		if err != nil {
			return "", fmt.Errorf("fill emptyDir %s: %w", e.Name(), err)
		}
		files += n
	}
	return fmt.Sprintf("filled %d emptyDir volume(s), %d file(s)", len(entries), files), nil
}
