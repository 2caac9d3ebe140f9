package ociruntime

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/treecopy"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/untar"
)

// A claimed checkpoint becomes the container: its volumes' and files' data
// put back, runc restore, and the state the CRI runtime expects of a create.

// emptyDirPath is how a kubelet's emptyDir volume ends on the node.
const emptyDirPath = "/volumes/kubernetes.io~empty-dir/"

// fillVolumes writes the emptyDir data staged for id's pod (VolumesKey,
// each volume under image.VolumesRoot/NAME) into the volumes of that name
// this container mounts, before CRIU restores the process, whose open files
// there must exist. The first create that mounts a volume claims its data
// (a rename within the stage) and fills it; the stage goes once all are.
func (r Runtime) fillVolumes(id Identity, mounts []bundleMount) error {
	podVolumes := StagePath(r.Stage, Identity{Namespace: id.Namespace, Pod: id.Pod, UID: id.UID, Container: VolumesKey})
	staged := filepath.Join(podVolumes, image.VolumesRoot)
	entries, err := os.ReadDir(staged)
	if err != nil {
		return nil // none staged
	}
	left := 0
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue // another container's claim
		}
		left++
		i := slices.IndexFunc(mounts, func(m bundleMount) bool { return strings.HasSuffix(m.Source, emptyDirPath+name) })
		if i < 0 {
			continue // another migrated container mounts it
		}
		claimed := filepath.Join(staged, "."+name+".claimed")
		if err := os.Rename(filepath.Join(staged, name), claimed); err != nil {
			return fmt.Errorf("claim the data of emptyDir %s: %w", name, err)
		}
		err := copyInto(claimed, mounts[i].Source)
		_ = os.RemoveAll(claimed)
		if err != nil {
			return fmt.Errorf("fill emptyDir %s: %w", name, err)
		}
		left--
	}
	if left == 0 {
		return os.RemoveAll(podVolumes)
	}
	return nil
}

// copyInto copies the tree at from into the directory to.
func copyInto(from, to string) error {
	src, err := os.OpenRoot(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenRoot(to)
	if err != nil {
		return err
	}
	defer dst.Close()
	_, err = treecopy.Copy(src, dst)
	return err
}

// applyRootfsChanges makes the new container's root filesystem what the
// checkpointed one was: the files it had changed (rootfs-diff.tar) written,
// those it had deleted (deleted.files) removed.
func applyRootfsChanges(checkpoint, rootfs string) error {
	// CRI-O writes a plain tar with deleted.files beside it; containerd
	// the container's layer as an image layer (gzip, whiteouts).
	if f, err := os.Open(filepath.Join(checkpoint, "rootfs-diff.tar")); err == nil {
		r, err := untar.Gunzipped(f)
		if err == nil {
			_, err = untar.Extract(r, rootfs, untar.Options{Owners: true, Whiteouts: true})
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("apply the container's file changes: %w", err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(checkpoint, "deleted.files"))
	if err != nil {
		return nil
	}
	var deleted []string
	if err := json.Unmarshal(raw, &deleted); err != nil {
		return fmt.Errorf("deleted.files: %w", err)
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, d := range deleted {
		if err := root.RemoveAll(strings.TrimPrefix(filepath.Clean("/"+d), "/")); err != nil {
			return fmt.Errorf("remove %s: %w", d, err)
		}
	}
	return nil
}

// createToRestore maps create's flags to restore's; the rest restore has
// no use for.
var createToRestore = map[string]bool{"--bundle": true, "-b": true, "--console-socket": true, "--pid-file": true}

func restoreArgs(inv invocation, checkpoint string) []string {
	args := append(append([]string{}, inv.global...), "restore", "--detach",
		"--image-path", filepath.Join(checkpoint, "checkpoint"), "--work-path", checkpoint)
	for i := 0; i < len(inv.flags); i++ {
		f := inv.flags[i]
		name, _, hasValue := strings.Cut(f, "=")
		switch {
		case f == "--no-pivot":
			args = append(args, f)
		case createToRestore[name] && hasValue:
			args = append(args, f)
		case createToRestore[name] && i+1 < len(inv.flags):
			args = append(args, f, inv.flags[i+1])
			i++
		case f == "--preserve-fds" && i+1 < len(inv.flags):
			i++
		}
	}
	return append(args, inv.id)
}

// restore runs runc restore for the create, and remembers the container
// as restored for its start. The checkpoint goes either way: a failed
// restore leaves the container to fail as any create would, and a restart
// starts the container afresh.
func (r Runtime) restore(inv invocation, checkpoint string) error {
	defer discard(checkpoint)
	cmd := exec.Command(r.Runc, restoreArgs(inv, checkpoint)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r.Stdin, r.Stdout, r.Stderr
	if err := cmd.Run(); err != nil {
		if log, readErr := os.ReadFile(filepath.Join(checkpoint, "restore.log")); readErr == nil {
			fmt.Fprintf(r.Stderr, "CRIU's restore log:\n%s\n", tail(log, 20))
		}
		return fmt.Errorf("runc restore: %w", err)
	}
	return os.WriteFile(filepath.Join(r.State, inv.id), nil, 0o600)
}

// stateAsCreated answers state for a container restored at create and not
// yet started: runc says it runs, but to its caller it is created until its
// start, as after any create (CRI-O refuses to start a container whose
// state is not "created").
func (r Runtime) stateAsCreated(args []string) error {
	cmd := exec.Command(r.Runc, args...)
	cmd.Stdin, cmd.Stderr = r.Stdin, r.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("runc state: %w", err)
	}
	var state map[string]any
	if err := json.Unmarshal(out, &state); err != nil {
		return fmt.Errorf("runc state: %w", err)
	}
	if state["status"] == "running" {
		state["status"] = "created"
	}
	return json.NewEncoder(r.Stdout).Encode(state)
}

// tail is the last n lines of b.
func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
