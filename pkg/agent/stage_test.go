package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/image"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"k8s.io/utils/ptr"
)

// TestDirectTransferStagesForTheRuntime: sent for staging, the archive is
// extracted under the stage for its pod's UID, whole, with no image made;
// Remove of its StagedPath deletes it; a stage name that would leave the
// stage is refused and nothing is written.
func TestDirectTransferStagesForTheRuntime(t *testing.T) {
	archiveDir, stageDir = t.TempDir(), t.TempDir()
	t.Cleanup(func() { archiveDir, stageDir = CheckpointDir, ociruntime.StageDir })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	direct, addr := startDirect(ctx, t)
	direct.StageDir = stageDir
	direct.Scope = "shop"

	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	pages := bytes.Repeat([]byte("memory "), 5_000_000) // more than one receiveChunk
	for _, f := range []struct {
		name string
		body []byte
	}{{"checkpoint/pages-1.img", pages}, {"config.dump", []byte("{}")}, {"rootfs-diff.tar", nil}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o600, Size: int64(len(f.body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(f.body)
	}
	_ = tw.Close()
	path := filepath.Join(archiveDir, "checkpoint-p_ns-app-1.tar")
	if err := os.WriteFile(path, archive.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	id := ociruntime.Identity{Namespace: "shop", Pod: "consumer-x", UID: "uid-1", Container: "app"}
	req := PackRequest{Archive: path, Container: "app", SendTo: addr, Repository: "shop/consumer", Tag: "app-x1", Token: "s3cret", CertSHA256: direct.CertSHA256()}

	evil := req
	evil.StageAs = &ociruntime.Identity{Namespace: "..", Pod: "etc", Container: "cron.d"}
	if _, err := Pack(ctx, evil, image.Registry{}); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a stage outside the stage directory: %v", err)
	}
	req.StageAs = &id
	res, err := Pack(ctx, req, image.Registry{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Staged != StagedPath(id) || res.Image != "" || res.ArchiveBytes != int64(archive.Len()) {
		t.Fatalf("result %+v", res)
	}
	staged := ociruntime.StagePath(stageDir, id)
	got, err := os.ReadFile(filepath.Join(staged, "checkpoint", "pages-1.img"))
	if err != nil || !bytes.Equal(got, pages) {
		t.Fatalf("staged pages: %d bytes, %v", len(got), err)
	}
	entries, _ := os.ReadDir(filepath.Dir(staged))
	if len(entries) != 1 {
		t.Fatalf("beside the staged checkpoint: %v", entries)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("the archive is still on the source node")
	}
	// An agent ended while extracting leaves its partial copy beside the
	// staged path; another container's is not this checkpoint's.
	partial := staged + receivingInfix + "0a1b2c"
	other := ociruntime.StagePath(stageDir, ociruntime.Identity{Namespace: "shop", Pod: "consumer-x", Container: "app2"}) + receivingInfix + "3d4e5f"
	for _, dir := range []string{partial, other} {
		if err := os.MkdirAll(filepath.Join(dir, "checkpoint"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := Remove(res.Staged); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(staged); !os.IsNotExist(err) {
		t.Fatal("Remove left the staged checkpoint")
	}
	if _, err := os.Stat(partial); !os.IsNotExist(err) {
		t.Fatal("Remove left a partial extraction of the checkpoint")
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("Remove took another container's extraction: %v", err)
	}
	if err := Remove(ociruntime.StageDir + "/shop/../../etc"); err == nil {
		t.Fatal("Remove took a path that leaves the stage")
	}
	if err := Remove(ociruntime.StageDir + "/shop/consumer-x/" + ociruntime.UIDPrefix + "uid-2"); err == nil {
		t.Fatal("Remove took a pod's UID directory as a handle")
	}

	// Sent before its pod exists (a StatefulSet's pod keeps its name), a
	// checkpoint is staged unbound, which no create claims, until Bind
	// gives it to the pod of the UID the migration created.
	if err := os.WriteFile(path, archive.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	req.StageAs = ptr.To(id.Unbound())
	if res, err = Pack(ctx, req, image.Registry{}); err != nil {
		t.Fatal(err)
	}
	unbound := ociruntime.StagePath(stageDir, id.Unbound())
	if _, err := os.Stat(filepath.Join(unbound, "checkpoint", "pages-1.img")); err != nil {
		t.Fatalf("staged unbound: %v", err)
	}
	if err := direct.bind([]ociruntime.Identity{id.Unbound()}); err == nil {
		t.Fatal("bound to no UID")
	}
	if err := direct.bind([]ociruntime.Identity{id}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(staged, "checkpoint", "pages-1.img")); err != nil {
		t.Fatalf("bound: %v", err)
	}
	if _, err := os.Stat(unbound); !os.IsNotExist(err) {
		t.Fatalf("still unbound after the bind: %v", err)
	}
	if err := direct.bind([]ociruntime.Identity{id}); err != nil {
		t.Fatalf("a bind retried: %v", err)
	}
	later := id
	later.UID = "uid-2"
	if err := direct.bind([]ociruntime.Identity{later}); err == nil {
		t.Fatal("a checkpoint bound to one pod was bound to another")
	}
	if err := Remove(res.Staged); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(unbound)); len(entries) != 1 || entries[0].Name() != filepath.Base(other) {
		t.Fatalf("left staged after Remove: %v", entries)
	}
}
