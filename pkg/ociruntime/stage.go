package ociruntime

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Where checkpoints wait for the containers they restore: the stage, by pod
// UID, and a create's claim of its own.

// ExpectedPath is the file a migration's agent leaves while the checkpoint
// for container of pod in namespace is on its way: the target pod is
// created before the source is checkpointed, so that its sandbox starts
// meanwhile, and the container's create waits for the checkpoint instead
// of starting afresh. It names no pod UID: it is left before the pod, and
// its UID, exist.
func ExpectedPath(stage string, id Identity) string {
	return StagePath(stage, id.Unbound()) + ExpectedSuffix
}

// StagePath is where container of pod in namespace is staged under stage:
// NAMESPACE/POD/CONTAINER while no UID binds it, and under the pod's UID
// (UIDPrefix) once bound. A create claims only a checkpoint bound to its
// own pod's UID.
func StagePath(stage string, id Identity) string {
	if id.UID == "" {
		return filepath.Join(stage, id.Namespace, id.Pod, id.Container)
	}
	return filepath.Join(stage, id.Namespace, id.Pod, UIDPrefix+id.UID, id.Container)
}

// UIDPrefix starts the directory of a pod's UID beside its containers'
// unbound checkpoints: no container's name has a dot.
const UIDPrefix = ".uid-"

// claim takes the checkpoint staged for the container being created, if
// any, out of the stage (one create restores it, once) into a directory of
// the container's own, returned.
func (r Runtime) claim(inv invocation) (string, Identity, error) {
	bundle, _ := value(inv.flags, "--bundle", "-b")
	if bundle == "" {
		bundle = "."
	}
	raw, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", Identity{}, nil // runc will say
	}
	var spec bundleSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return "", Identity{}, nil
	}
	id, ok := identityOf(r.CRI, spec.Annotations)
	if !ok || id.UID == "" || id.Valid() != nil || inv.id == "" || strings.ContainsAny(inv.id, `/\`) {
		return "", Identity{}, nil
	}
	staged := StagePath(r.Stage, id)
	if err := r.awaitBound(id); err != nil {
		return "", Identity{}, err
	}
	if _, err := os.Stat(staged); err != nil {
		return "", Identity{}, r.restartAfterLazyRestore(id)
	}
	if err := os.MkdirAll(r.State, 0o700); err != nil {
		return "", Identity{}, err
	}
	// The stage and the state directory are on different filesystems on
	// most nodes (disk and tmpfs): a rename across them fails, so the
	// checkpoint is claimed by a rename within the stage first.
	within := staged + ".claimed-" + inv.id
	if err := os.Rename(staged, within); err != nil {
		return "", Identity{}, fmt.Errorf("claim the checkpoint staged for %s/%s %s: %w", id.Namespace, id.Pod, id.Container, err)
	}
	rootfs := spec.Root.Path
	if !filepath.IsAbs(rootfs) {
		rootfs = filepath.Join(bundle, rootfs)
	}
	if err := applyRootfsChanges(within, rootfs); err != nil {
		discard(within)
		return "", Identity{}, fmt.Errorf("restore %s/%s %s: %w", id.Namespace, id.Pod, id.Container, err)
	}
	if err := r.fillVolumes(id, spec.Mounts); err != nil {
		discard(within)
		return "", Identity{}, fmt.Errorf("restore %s/%s %s: %w", id.Namespace, id.Pod, id.Container, err)
	}
	return within, id, nil
}

// discard deletes a claimed checkpoint, and its pod UID's directory once
// no other container's is in it (a target agent that stages one meanwhile
// makes the directory again: agent.Direct's stage).
func discard(claimed string) {
	_ = os.RemoveAll(claimed)
	_ = os.Remove(filepath.Dir(claimed))
}

// awaitBound waits, while a checkpoint for id's name is on its way
// (ExpectedPath) or staged but bound to no pod yet (unbound StagePath),
// until one is staged for id's pod UID. A container whose name a migration
// awaits never starts afresh in this create: if the mark and the unbound
// checkpoint go first (the migration rolled back, and deletes the pod), or
// the wait runs out, the create fails. A pod that took the name of a
// migration's target waits for a checkpoint bound to its own UID, which
// never comes.
func (r Runtime) awaitBound(id Identity) error {
	staged, expected, unbound := StagePath(r.Stage, id), ExpectedPath(r.Stage, id), StagePath(r.Stage, id.Unbound())
	awaited := func() bool {
		_, markErr := os.Stat(expected)
		_, unboundErr := os.Stat(unbound)
		return markErr == nil || unboundErr == nil
	}
	if !awaited() {
		return nil
	}
	timeout := cmp.Or(r.ExpectTimeout, ExpectTimeout)
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(staged); err == nil {
			_ = os.Remove(expected)
			return nil
		}
		if !awaited() {
			return fmt.Errorf("the migration expecting a checkpoint for %s/%s %s ended without one", id.Namespace, id.Pod, id.Container)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the checkpoint expected for %s/%s %s did not arrive within %s", id.Namespace, id.Pod, id.Container, timeout)
		}
	}
}
