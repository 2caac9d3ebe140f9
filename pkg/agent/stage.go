package agent

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/untar"
)

// Staging: for the restore path that needs no CRI restore, the target's
// agent extracts a received checkpoint straight from the connection into
// the node's ociruntime.StageDir, where the kubectl-migrate runtime finds
// it at the target container's create. No image is made, pushed or pulled,
// and the archive is written to the node's disk once.

// stageDir is ociruntime.StageDir; tests point it at a temporary directory.
var stageDir = ociruntime.StageDir

// StagedPath is how a migration names a staged checkpoint: what Remove
// takes to delete it, bound to a pod's UID or not (the path names none).
func StagedPath(id ociruntime.Identity) string {
	return ociruntime.StagePath(ociruntime.StageDir, id.Unbound())
}

// ExpectedPath is how a migration names the mark that a checkpoint for id
// is on its way (ociruntime.ExpectedPath), which Remove takes as it takes
// a StagedPath.
func ExpectedPath(id ociruntime.Identity) string {
	return ociruntime.ExpectedPath(ociruntime.StageDir, id)
}

// expectRequest names the containers whose checkpoints are on their way.
type expectRequest struct {
	Containers []ociruntime.Identity `json:"containers"`
}

// expect marks each container's checkpoint as on its way (ExpectedPath):
// the container's create under the kubectl-migrate runtime then waits for
// it instead of starting afresh.
func (d *Direct) expect(ids []ociruntime.Identity) error {
	if d.StageDir == "" {
		return fmt.Errorf("this agent stages no checkpoints (it was started without --stage)")
	}
	for _, id := range ids {
		if err := id.Valid(); err != nil {
			return err
		}
		mark := ociruntime.ExpectedPath(d.StageDir, id)
		if err := os.MkdirAll(filepath.Dir(mark), 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(mark, nil, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// bindRequest names the containers whose checkpoints, staged before their
// pod existed, are now its: Containers carry the pod's UID.
type bindRequest struct {
	Containers []ociruntime.Identity `json:"containers"`
}

// bind moves each checkpoint staged unbound (before its pod existed: a
// StatefulSet's pod keeps its name, so it is created after the source has
// gone) under the UID of the pod the migration created, which alone may
// restore it. One already bound to that UID is left as it is (a retry).
func (d *Direct) bind(ids []ociruntime.Identity) error {
	if d.StageDir == "" {
		return fmt.Errorf("this agent stages no checkpoints (it was started without --stage)")
	}
	for _, id := range ids {
		if err := id.Valid(); err != nil {
			return err
		}
		if id.UID == "" {
			return fmt.Errorf("bind %s: no pod UID", stageQuery(id))
		}
		bound := ociruntime.StagePath(d.StageDir, id)
		if _, err := os.Stat(bound); err == nil {
			continue
		}
		if err := inDir(filepath.Dir(bound), func() error {
			return os.Rename(ociruntime.StagePath(d.StageDir, id.Unbound()), bound)
		}); err != nil {
			_ = os.Remove(filepath.Dir(bound)) // the UID's directory, if empty
			return fmt.Errorf("bind the checkpoint staged for %s: %w", stageQuery(id), err)
		}
	}
	return nil
}

// inDir makes dir and runs create in it. The runtime deletes a pod UID's
// directory once it restored the last checkpoint in it; another container's
// arriving at that moment makes the directory again.
func inDir(dir string, create func() error) error {
	var err error
	for range 3 {
		if err = os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		if err = create(); !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

// stagedIdentity reads a StagedPath, or an ExpectedPath (as the identity
// of a container named with ExpectedSuffix: Remove deletes either alike).
func stagedIdentity(path string) (ociruntime.Identity, bool) {
	rest, ok := strings.CutPrefix(filepath.Clean(path), ociruntime.StageDir+"/")
	if !ok {
		return ociruntime.Identity{}, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return ociruntime.Identity{}, false // a handle names no UID
	}
	id := ociruntime.Identity{Namespace: parts[0], Pod: parts[1], Container: parts[2]}
	return id, id.Valid() == nil
}

// stageQuery is the receive query's spelling of an identity:
// NAMESPACE/POD/CONTAINER, then /UID when it is bound to a pod's.
func stageQuery(id ociruntime.Identity) string {
	q := id.Namespace + "/" + id.Pod + "/" + id.Container
	if id.UID != "" {
		q += "/" + id.UID
	}
	return q
}

// stageIdentity reads a request's stage query (stageQuery), which must
// name a container of the agent's scope; it answers the refusal itself.
func (d *Direct) stageIdentity(w http.ResponseWriter, query string) (ociruntime.Identity, bool) {
	id, err := parseStageQuery(query)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return id, false
	}
	if err := d.Scope.allowIdentities([]ociruntime.Identity{id}); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return id, false
	}
	return id, true
}

func parseStageQuery(s string) (ociruntime.Identity, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 && len(parts) != 4 {
		return ociruntime.Identity{}, fmt.Errorf("stage %q is not NAMESPACE/POD/CONTAINER[/UID]", s)
	}
	id := ociruntime.Identity{Namespace: parts[0], Pod: parts[1], Container: parts[2]}
	if len(parts) == 4 {
		id.UID = parts[3]
	}
	return id, id.Valid()
}

// stage extracts the size bytes of the archive from conn (those already
// read first) under the stage, for id. A checkpoint staged for id before
// (a retried transfer) is replaced; one being extracted is never seen by
// the runtime: it appears whole, by a rename.
func (d *Direct) stage(conn net.Conn, buffered *bufio.Reader, size int64, id ociruntime.Identity) (PackResult, error) {
	if d.StageDir == "" {
		return PackResult{}, fmt.Errorf("this agent stages no checkpoints (it was started without --stage)")
	}
	final := ociruntime.StagePath(d.StageDir, id) // bound if the pod exists already
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	tmp := final + receivingInfix + hex.EncodeToString(suffix)
	if err := inDir(filepath.Dir(final), func() error { return os.Mkdir(tmp, 0o700) }); err != nil {
		return PackResult{}, err
	}
	archive := &countingReader{r: io.LimitReader(io.MultiReader(io.LimitReader(buffered, int64(buffered.Buffered())), deadlineReader{conn}), size)}
	// TLS hands over a record (16 KiB) per read: filling each read keeps
	// the extracted files' writes as large as the extractor's buffer.
	archive.r = fillingReader{archive.r}
	_, err := untar.Extract(archive, tmp, untar.Options{MaxBytes: size, Owners: true})
	if err == nil {
		// What follows tar's end marker (padding) is the sender's too.
		_, err = io.Copy(io.Discard, archive)
	}
	if err == nil && archive.n < size {
		err = fmt.Errorf("received %d of %d bytes: %w", archive.n, size, io.ErrUnexpectedEOF)
	}
	if err == nil {
		_ = os.RemoveAll(final)
		err = os.Rename(tmp, final)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return PackResult{}, fmt.Errorf("stage the checkpoint for %s: %w", stageQuery(id), err)
	}
	return PackResult{ArchiveBytes: size, Staged: StagedPath(id)}, nil
}

// removeStagedAll deletes what a migration's handle on a staged checkpoint
// (StagedPath, id without UID) names under stage: the checkpoint unbound,
// or bound to any pod's UID, and extractions of it left mid-way.
func removeStagedAll(stage string, id ociruntime.Identity) error {
	unbound := ociruntime.StagePath(stage, id.Unbound())
	errs := []error{removeStaged(unbound)}
	// Bound to a pod's UID: under each UID directory of the pod's name.
	bound, _ := filepath.Glob(filepath.Join(filepath.Dir(unbound), ociruntime.UIDPrefix+"*", id.Container))
	for _, b := range bound {
		errs = append(errs, removeStaged(b))
		_ = os.Remove(filepath.Dir(b)) // the UID's directory, once empty
	}
	return errors.Join(errs...)
}

// receivingInfix names a checkpoint being extracted beside its StagePath.
const receivingInfix = ".receiving-"

// removeStaged deletes the checkpoint staged at final and any extraction of
// one for it that an agent ended mid-way left beside it: process memory,
// which the agent's own cleanup never reached, and no journal names.
func removeStaged(final string) error {
	errs := []error{os.RemoveAll(final)}
	entries, err := os.ReadDir(filepath.Dir(final))
	if err != nil && !os.IsNotExist(err) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), filepath.Base(final)+receivingInfix) {
			errs = append(errs, os.RemoveAll(filepath.Join(filepath.Dir(final), e.Name())))
		}
	}
	return errors.Join(errs...)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// fillingReader fills each read unless the stream ends first.
type fillingReader struct{ r io.Reader }

func (f fillingReader) Read(p []byte) (int, error) {
	n, err := io.ReadFull(f.r, p)
	if err == io.ErrUnexpectedEOF {
		err = io.EOF
	}
	return n, err
}

// deadlineReader reads a hijacked connection, each read bounded: a sender
// silent this long is gone.
type deadlineReader struct{ conn net.Conn }

func (r deadlineReader) Read(p []byte) (int, error) {
	_ = r.conn.SetReadDeadline(time.Now().Add(receiveIdle))
	return r.conn.Read(p)
}
