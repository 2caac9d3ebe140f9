package ociruntime

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Lazy pages (post-copy). For a container that runs under this runtime, a
// migration's source agent can ask that its next checkpoint keep the
// process's memory where it is (LazyRequestPath): the checkpoint call the
// CRI runtime makes then becomes runc checkpoint --lazy-pages, which
// freezes the process, writes everything but its memory, and serves the
// pages from the frozen process through CRIU's page server until the
// restored copy has them all. The CRI runtime archives the rest as it
// would any checkpoint, marked lazy (lazyMarker), and the call returns
// while the pages wait. On the target, the create that restores a lazy
// checkpoint starts CRIU's lazy-pages daemon before runc restore
// --lazy-pages: the copy runs at once, its missing pages faulted in through
// userfaultfd as it touches them while the daemon pulls the rest.
//
// CRIU's page server speaks plain TCP and answers anyone who connects. So
// it and the daemon each run in a network namespace of their own, holding
// only loopback, and a helper process beside each bridges that loopback to
// a Unix socket in the stage (PagesSocket; root only), which the node's
// agent joins to the migration's TLS stream between the two agents. No
// page is reachable from any network.
//
// The source resumes when the page session ends, whether every page went
// or the stream broke (the CRI runtime asked for --leave-running, and a
// failed session thaws too): CRIU's own outcome does not tell a complete
// transfer from a target that went away. The target's daemon does: it
// exits successfully only once every page arrived, and its helper records
// that (PagesResult) for the migration, whose commit waits for it.

// Paths and names of lazy pages.
const (
	// LazySuffix marks, beside a source container's bound StagePath, a
	// request that its next checkpoint leave its pages in the source.
	LazySuffix = ".lazy"
	// PagesDir holds the page sockets and results, under names short
	// enough for a Unix socket's path.
	PagesDir = ".pages"
	// lazyMarker is the file a lazy checkpoint carries in CRIU's image
	// directory, so the restore knows to fetch its pages.
	lazyMarker = "kubectl-migrate-lazy-pages"
	// helperEnv runs this binary as a lazy-pages helper (its role).
	helperEnv = "KUBECTL_MIGRATE_PAGES_HELPER"
	// pagesIdle bounds each helper's wait for the other side of its
	// socket: a migration that died leaves no frozen source behind, and
	// none frozen for longer than a liveness probe may allow (the source's
	// agent connects right after sending the archive, within a second on
	// the lab; a plugin killed before that left a source frozen for two
	// minutes, past its rollback's wait).
	pagesIdle = 10 * time.Second
	// pagesStall ends a page session in which nothing moved this long
	// (bridge).
	pagesStall = 10 * time.Second
)

// LazyRequestPath is where a source agent asks for lazy pages at the next
// checkpoint of id (a bound identity: the source pod's UID).
func LazyRequestPath(stage string, id Identity) string { return StagePath(stage, id) + LazySuffix }

// pagesKey names id's page socket and result: a hash, since a socket's
// path is limited to 107 bytes. The UID is left out: a target's socket is
// made before its pod may exist.
func pagesKey(id Identity) string {
	sum := sha256.Sum256([]byte(id.Namespace + "/" + id.Pod + "/" + id.Container))
	return hex.EncodeToString(sum[:12])
}

// PagesSocket is the Unix socket where id's pages cross between the
// runtime's helper and the node's agent: on the source the helper listens
// and the agent connects; on the target the agent listens and the helper
// connects.
func PagesSocket(stage string, id Identity) string {
	return filepath.Join(stage, PagesDir, pagesKey(id)+".sock")
}

// PagesResultPath is where the target's helper records how id's lazy
// restore ended, and the source's how its page session did (the source
// runs again from then on).
func PagesResultPath(stage string, id Identity) string {
	return filepath.Join(stage, PagesDir, pagesKey(id)+".json")
}

// PagesResult is how a lazy restore's page transfer ended on the target.
type PagesResult struct {
	// UID is the restored pod's.
	UID string `json:"uid,omitempty"`
	// Done: every page arrived (CRIU's lazy-pages daemon ended well).
	Done bool `json:"done"`
	// Error says why not.
	Error string `json:"error,omitempty"`
	// Restored is when the copy ran, LastPage when the daemon ended.
	Restored time.Time `json:"restored"`
	LastPage time.Time `json:"lastPage"`
}

// ReadPagesResult reads id's result; ok is false while the transfer runs.
func ReadPagesResult(stage string, id Identity) (res PagesResult, ok bool, err error) {
	raw, err := os.ReadFile(PagesResultPath(stage, id))
	if errors.Is(err, os.ErrNotExist) {
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	return res, true, json.Unmarshal(raw, &res)
}

// helperConfig is what the runtime tells a helper it starts (in
// helperEnv's value, as JSON).
type helperConfig struct {
	Role string `json:"role"` // "dump" or "restore"
	// Command is what the helper runs: runc checkpoint (dump) or CRIU's
	// lazy-pages daemon (restore), without the page server's address,
	// which the helper adds ({{port}} stands for it).
	Command []string `json:"command"`
	// Socket is PagesSocket; Result, the restore's PagesResultPath.
	Socket string `json:"socket"`
	Result string `json:"result,omitempty"`
	// Running marks the restore's transfer as not ended; UID is the
	// restored pod's (PagesResult.UID).
	Running string `json:"running,omitempty"`
	UID     string `json:"uid,omitempty"`
	// Images is CRIU's image directory; Work its work directory (where
	// the daemon's socket appears) and the helper's log; Discard, what the
	// restore deletes once its daemon ended.
	Images  string `json:"images"`
	Work    string `json:"work"`
	Discard string `json:"discard,omitempty"`
	// Resume is runc resume of the checkpointed container: the CRI
	// runtime paused it around the checkpoint call and resumed it as the
	// call returned, but CRIU puts the cgroup freezer back as it found it
	// (frozen) when the page session ends, long after.
	Resume []string `json:"resume,omitempty"`
	// PidFile is where runc restore writes the restored process's PID:
	// the restore's helper ends the daemon if that process dies.
	PidFile string `json:"pidFile,omitempty"`
	// Isolated: the helper runs in a network namespace of its own and
	// must bring its loopback up.
	Isolated bool `json:"isolated"`
}

// checkpointLazily is the checkpoint of a container whose migration asked
// for lazy pages (claimLazyRequest); ok is false for any other.
func (r Runtime) checkpointLazily(inv invocation) (ok bool, err error) {
	id, found := r.identityFromState(inv)
	if !found {
		return false, nil
	}
	request := LazyRequestPath(r.Stage, id)
	if err := os.Remove(request); err != nil {
		return false, nil // no request: one checkpoint consumes it
	}
	images, _ := value(inv.flags, "--image-path")
	work, _ := value(inv.flags, "--work-path")
	if images == "" {
		return true, errors.New("a lazy checkpoint needs --image-path")
	}
	work = cmp.Or(work, images)
	command := append(append([]string{r.Runc}, inv.global...), "checkpoint")
	command = append(command, inv.flags...)
	command = append(command, "--lazy-pages", "--page-server", "127.0.0.1:{{port}}", "--status-fd", "3", inv.id)
	// runc makes the directory itself; the mark goes in first.
	if err := os.MkdirAll(images, 0o700); err != nil {
		return true, err
	}
	if err := os.WriteFile(filepath.Join(images, lazyMarker), nil, 0o600); err != nil {
		return true, err
	}
	result := PagesResultPath(r.Stage, id.Unbound())
	_ = os.Remove(result)
	resume := append(append([]string{r.Runc}, inv.global...), "resume", inv.id)
	return true, r.startHelper(helperConfig{Role: "dump", Command: command, Resume: resume, Socket: PagesSocket(r.Stage, id), Result: result, Images: images, Work: work})
}

// restoreLazily restores a lazy checkpoint: the daemon first, then runc
// restore --lazy-pages. The helper deletes the checkpoint once the last
// page arrived (or the transfer failed); a failed restore ends the helper.
func (r Runtime) restoreLazily(inv invocation, id Identity, checkpoint string) error {
	images := filepath.Join(checkpoint, "checkpoint")
	criu := "criu"
	if v, ok := value(inv.global, "--criu"); ok {
		criu = v
	}
	result := PagesResultPath(r.Stage, id.Unbound())
	_ = os.Remove(result)
	running := pagesRunningPath(r.Stage, id.Unbound())
	if err := os.MkdirAll(filepath.Dir(running), 0o700); err != nil {
		discard(checkpoint)
		return err
	}
	if err := os.WriteFile(running, []byte(id.UID), 0o600); err != nil {
		discard(checkpoint)
		return err
	}
	cfg := helperConfig{
		Role:    "restore",
		Command: []string{criu, "lazy-pages", "--page-server", "--address", "127.0.0.1", "--port", "{{port}}", "-D", images, "-W", checkpoint, "-o", "lazy-pages.log"},
		Socket:  PagesSocket(r.Stage, id.Unbound()), Result: result, Running: running, UID: id.UID, Images: images, Work: checkpoint, Discard: checkpoint,
	}
	cfg.PidFile, _ = value(inv.flags, "--pid-file")
	if err := r.startHelper(cfg); err != nil {
		discard(checkpoint)
		_ = os.Remove(running)
		return err
	}
	args := restoreArgs(inv, checkpoint)
	args = append(args[:len(args)-1:len(args)-1], "--lazy-pages", inv.id)
	cmd := exec.Command(r.Runc, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r.Stdin, r.Stdout, r.Stderr
	if err := cmd.Run(); err != nil {
		if log, readErr := os.ReadFile(filepath.Join(checkpoint, "restore.log")); readErr == nil {
			fmt.Fprintf(r.Stderr, "CRIU's restore log:\n%s\n", tail(log, 20))
		}
		// The daemon waits for a restore that will not come: closing its
		// socket ends it, and the helper records the failure.
		_ = os.Remove(filepath.Join(checkpoint, "lazy-pages.socket"))
		writeResult(result, PagesResult{UID: id.UID, Error: "runc restore failed: " + err.Error(), LastPage: time.Now()})
		_ = os.Remove(running)
		return fmt.Errorf("runc restore --lazy-pages: %w", err)
	}
	return os.WriteFile(filepath.Join(r.State, inv.id), nil, 0o600)
}

// restartAfterLazyRestore refuses to start afresh a container of the pod
// whose lazy restore has not ended well: a copy that died while its pages
// arrived is restarted by the kubelet, and a fresh process would take the
// work its migration is rolling back to the source (a consumer would take
// its queue's messages). The kubelet tries again until the rollback
// deletes the pod; once every page arrived, a restart starts afresh as any
// does.
func (r Runtime) restartAfterLazyRestore(id Identity) error {
	if _, err := os.Stat(pagesRunningPath(r.Stage, id.Unbound())); err == nil {
		return fmt.Errorf("%s/%s %s is being restored with lazy pages: it does not start afresh meanwhile", id.Namespace, id.Pod, id.Container)
	}
	res, ended, err := ReadPagesResult(r.Stage, id.Unbound())
	if err != nil || !ended || res.Done || res.UID != id.UID {
		return nil
	}
	return fmt.Errorf("the pages of %s/%s %s did not all arrive (%s): it does not start afresh while its migration rolls back", id.Namespace, id.Pod, id.Container, res.Error)
}

// pagesRunningPath marks a lazy restore whose transfer has not ended.
func pagesRunningPath(stage string, id Identity) string {
	return filepath.Join(stage, PagesDir, pagesKey(id)+".running")
}

// isLazy: the checkpoint's pages wait in its source.
func isLazy(checkpoint string) bool {
	_, err := os.Stat(filepath.Join(checkpoint, "checkpoint", lazyMarker))
	return err == nil
}

// identityFromState reads the identity of a running container from its
// bundle, which runc's state names.
func (r Runtime) identityFromState(inv invocation) (Identity, bool) {
	if inv.id == "" {
		return Identity{}, false
	}
	out, err := exec.Command(r.Runc, append(append(append([]string{}, inv.global...), "state"), inv.id)...).Output()
	if err != nil {
		return Identity{}, false
	}
	var state struct {
		Bundle string `json:"bundle"`
	}
	if json.Unmarshal(out, &state) != nil || state.Bundle == "" {
		return Identity{}, false
	}
	raw, err := os.ReadFile(filepath.Join(state.Bundle, "config.json"))
	if err != nil {
		return Identity{}, false
	}
	var spec bundleSpec
	if json.Unmarshal(raw, &spec) != nil {
		return Identity{}, false
	}
	id, ok := identityOf(r.CRI, spec.Annotations)
	return id, ok && id.UID != "" && id.Valid() == nil
}
