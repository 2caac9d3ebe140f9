//go:build linux

package agent

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

const testUID = "0b7c3d52-6b1a-4b9e-9a55-3f0d1c2e4a77"

// volumeFixture makes the kubelet's directory of a pod with two emptyDir
// volumes, and points the agent at it.
func volumeFixture(t *testing.T) {
	t.Helper()
	pods, archives := t.TempDir(), t.TempDir()
	oldPods, oldArchives := podsDir, archiveDir
	podsDir, archiveDir = pods, archives
	t.Cleanup(func() { podsDir, archiveDir = oldPods, oldArchives })
	scratch := filepath.Join(pods, testUID, "volumes", "kubernetes.io~empty-dir", "scratch")
	mem := filepath.Join(pods, testUID, "volumes", "kubernetes.io~empty-dir", "mem")
	for _, d := range []string{filepath.Join(scratch, "sub"), mem} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, data string, mode os.FileMode) {
		if err := os.WriteFile(path, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(scratch, "ledger"), "1\n2\n3\n", 0o640)
	write(filepath.Join(scratch, "sub", "cache.bin"), strings.Repeat("x", 1000), 0o600)
	write(filepath.Join(mem, "state"), "warm", 0o644)
	if err := os.Symlink("ledger", filepath.Join(scratch, "latest")); err != nil {
		t.Fatal(err)
	}
	// A link the pod planted to a file of the node: kept as a link, never
	// followed by the agent, which runs as root.
	if err := os.Symlink("/etc/hostname", filepath.Join(scratch, "escape")); err != nil {
		t.Fatal(err)
	}
	// A pipe (as a socket would be): the restored process makes its own.
	if err := syscall.Mkfifo(filepath.Join(scratch, "app.pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// extract unpacks a snapshot as a runtime unpacks an image layer.
func extract(t *testing.T, archive, root string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(path, os.FileMode(h.Mode).Perm())
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, path)
		case tar.TypeReg:
			var data []byte
			if data, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(path, data, os.FileMode(h.Mode).Perm())
			}
		default:
			t.Fatalf("unexpected entry %s (%c)", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestEmptyDirSnapshotAndFill: the agent's snapshot of a pod's emptyDir
// volumes, unpacked as an image layer and copied by the init container's
// fill-volumes, gives the target pod's volumes the same files, modes and
// links; sockets are left to the restored process; links are never
// followed.
func TestEmptyDirSnapshotAndFill(t *testing.T) {
	volumeFixture(t)
	archive := filepath.Join(archiveDir, "checkpoint-consumer_default-"+VolumesKey+"-abcde.tar")
	res, err := SnapshotVolumes(SnapshotRequest{PodUID: testUID, Volumes: []string{"mem", "scratch"}, Archive: archive, MaxBytes: 1 << 20}, "ns")
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 3 || res.Bytes != 6+1000+4 || !slices.Equal(res.Skipped, []string{"scratch/app.pipe"}) {
		t.Fatalf("snapshot %+v", res)
	}
	image := t.TempDir()
	extract(t, archive, image)
	mounts := t.TempDir()
	for _, v := range []string{"mem", "scratch"} {
		if err := os.Mkdir(filepath.Join(mounts, v), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := FillVolumes(filepath.Join(image, "ms2m", "volumes"), mounts); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{"scratch/ledger": "1\n2\n3\n", "scratch/sub/cache.bin": strings.Repeat("x", 1000), "mem/state": "warm"} {
		got, err := os.ReadFile(filepath.Join(mounts, path))
		if err != nil || string(got) != want {
			t.Errorf("%s: %q, %v", path, got, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(mounts, "scratch", "ledger")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("ledger's mode: %v %v", fi.Mode(), err)
	}
	for link, want := range map[string]string{"latest": "ledger", "escape": "/etc/hostname"} {
		if got, err := os.Readlink(filepath.Join(mounts, "scratch", link)); err != nil || got != want {
			t.Errorf("link %s → %q (%v), want %q", link, got, err, want)
		}
	}
	if _, err := os.Lstat(filepath.Join(mounts, "scratch", "app.pipe")); !os.IsNotExist(err) {
		t.Errorf("the pipe was copied: %v", err)
	}
}

// TestEmptyDirSnapshotRefusals: over the bound, and any name that could
// lead the agent out of the pod's volumes, is refused, with no archive left.
func TestEmptyDirSnapshotRefusals(t *testing.T) {
	volumeFixture(t)
	archive := filepath.Join(archiveDir, "checkpoint-consumer_default-"+VolumesKey+"-abcde.tar")
	if _, err := SnapshotVolumes(SnapshotRequest{PodUID: testUID, Volumes: []string{"scratch"}, Archive: archive, MaxBytes: 500}, "ns"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the bound: %v", err)
	}
	if _, err := os.Stat(archive); !os.IsNotExist(err) {
		t.Fatalf("a refused snapshot left its archive: %v", err)
	}
	if res, err := SnapshotVolumes(SnapshotRequest{PodUID: testUID, Volumes: []string{"scratch"}, MaxBytes: 2000}, "ns"); err != nil || res.Bytes != 1006 || res.Archive != "" {
		t.Fatalf("measuring: %+v %v", res, err)
	}
	for _, req := range []SnapshotRequest{
		{PodUID: "../" + testUID, Volumes: []string{"scratch"}},
		{PodUID: testUID, Volumes: []string{"../../../etc"}},
		{PodUID: testUID, Volumes: []string{"scratch"}, Archive: "/etc/shadow.tar"},
	} {
		if _, err := SnapshotVolumes(req, "ns"); err == nil {
			t.Errorf("%+v was not refused", req)
		}
	}
	if _, err := FillVolumes(filepath.Join(podsDir, testUID, "volumes", "kubernetes.io~empty-dir"), t.TempDir()); err == nil || !strings.Contains(err.Error(), "is not mounted") {
		t.Fatalf("fill into missing mounts: %v", err)
	}
}
