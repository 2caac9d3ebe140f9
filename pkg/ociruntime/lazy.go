package ociruntime

import (
	"bufio"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	// socket: a migration that died leaves no frozen source behind.
	pagesIdle = 2 * time.Minute
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
// restore ended.
func PagesResultPath(stage string, id Identity) string {
	return filepath.Join(stage, PagesDir, pagesKey(id)+".json")
}

// PagesResult is how a lazy restore's page transfer ended on the target.
type PagesResult struct {
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
	// Images is CRIU's image directory; Work its work directory (where
	// the daemon's socket appears) and the helper's log; Discard, what the
	// restore deletes once its daemon ended.
	Images  string `json:"images"`
	Work    string `json:"work"`
	Discard string `json:"discard,omitempty"`
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
	if err := os.WriteFile(filepath.Join(images, lazyMarker), nil, 0o600); err != nil {
		return true, err
	}
	return true, r.startHelper(helperConfig{Role: "dump", Command: command, Socket: PagesSocket(r.Stage, id), Images: images, Work: work})
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
	cfg := helperConfig{
		Role:    "restore",
		Command: []string{criu, "lazy-pages", "--page-server", "--address", "127.0.0.1", "--port", "{{port}}", "-D", images, "-W", checkpoint, "-o", "lazy-pages.log"},
		Socket:  PagesSocket(r.Stage, id.Unbound()), Result: result, Images: images, Work: checkpoint, Discard: checkpoint,
	}
	if err := r.startHelper(cfg); err != nil {
		discard(checkpoint)
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
		writeResult(result, PagesResult{Error: "runc restore failed: " + err.Error(), LastPage: time.Now()})
		return fmt.Errorf("runc restore --lazy-pages: %w", err)
	}
	return os.WriteFile(filepath.Join(r.State, inv.id), nil, 0o600)
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

// startHelper starts this binary as a helper, detached (its own session:
// it outlives this invocation), in a network namespace of its own unless
// the runtime shares its network (tests), and waits until it is ready: the
// source frozen and its page server listening, or the daemon waiting for
// the restore.
func (r Runtime) startHelper(cfg helperConfig) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.Isolated = !r.SharedNetwork
	raw, _ := json.Marshal(cfg)
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o700); err != nil {
		return err
	}
	log, err := os.OpenFile(filepath.Join(cfg.Work, "pages-helper.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	ready, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer ready.Close()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{readyW}
	cmd.SysProcAttr = helperAttr(cfg.Isolated)
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		return fmt.Errorf("start the lazy-pages helper: %w", err)
	}
	_ = cmd.Process.Release()
	line, _ := bufio.NewReader(ready).ReadString('\n')
	switch {
	case line == "ok\n":
		return nil
	case strings.HasPrefix(line, "error: "):
		return errors.New(strings.TrimSpace(strings.TrimPrefix(line, "error: ")))
	}
	b, _ := os.ReadFile(log.Name())
	return fmt.Errorf("the lazy-pages helper ended before it was ready: %s", tail(b, 10))
}

// HelperMain runs this process as a lazy-pages helper, if the runtime
// started it as one (ok); its result is the exit status.
func HelperMain() (status int, ok bool) {
	raw, ok := os.LookupEnv(helperEnv)
	if !ok {
		return 0, false
	}
	// Nothing this helper runs may become a helper in turn.
	_ = os.Unsetenv(helperEnv)
	var cfg helperConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "pages helper:", err)
		return 1, true
	}
	ready := os.NewFile(3, "ready")
	if err := runHelper(cfg, ready); err != nil {
		fmt.Fprintln(os.Stderr, "pages helper:", err)
		return 1, true
	}
	return 0, true
}

// runHelper does a helper's work; ready gets "ok" or "error: …" once.
func runHelper(cfg helperConfig, ready *os.File) error {
	var once sync.Once
	tell := func(err error) {
		once.Do(func() {
			if err != nil {
				fmt.Fprintf(ready, "error: %s\n", strings.ReplaceAll(err.Error(), "\n", "; "))
			} else {
				fmt.Fprintln(ready, "ok")
			}
			ready.Close()
		})
	}
	err := helperWork(cfg, func() { tell(nil) })
	tell(err)
	return err
}

func helperWork(cfg helperConfig, ready func()) error {
	if cfg.Isolated {
		if err := loopbackUp(); err != nil {
			return fmt.Errorf("bring up loopback: %w", err)
		}
	}
	if cfg.Role == "restore" {
		return helperRestore(cfg, ready)
	}
	return helperDump(cfg, ready)
}

// helperDump runs runc checkpoint --lazy-pages, tells the runtime once the
// source is frozen and its page server listens, then joins the page server
// to the first connection on the socket (the source agent's), and waits
// for the session's end.
func helperDump(cfg helperConfig, ready func()) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	_ = os.Remove(cfg.Socket)
	ln, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		return err
	}
	defer os.Remove(cfg.Socket)
	defer ln.Close()
	status, statusW, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := helperCommand(cfg, port)
	cmd.ExtraFiles = []*os.File{statusW}
	if err := cmd.Start(); err != nil {
		return err
	}
	statusW.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	frozen := make(chan struct{})
	go func() {
		if _, err := status.Read(make([]byte, 1)); err == nil {
			close(frozen)
		}
	}()
	select {
	case <-frozen:
	case err := <-exited:
		return fmt.Errorf("runc checkpoint --lazy-pages: %v: %s", err, logTail(filepath.Join(cfg.Work, "dump.log")))
	}
	ready()
	agent, err := acceptWithin(ln, pagesIdle)
	pages, dialErr := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	switch {
	case dialErr != nil:
		err = dialErr
	case agent == nil:
		// Nobody came for the pages: ending the session resumes the
		// source rather than leave it frozen.
		pages.Close()
	default:
		bridge(agent, pages)
	}
	if waitErr := <-exited; waitErr != nil && err == nil {
		err = fmt.Errorf("runc checkpoint --lazy-pages: %v: %s", waitErr, logTail(filepath.Join(cfg.Work, "dump.log")))
	}
	return err
}

// helperRestore starts CRIU's lazy-pages daemon, tells the runtime once it
// waits for the restore, joins the daemon's connection to the page server
// to the agent's socket, and records how the transfer ended.
func helperRestore(cfg helperConfig, ready func()) (err error) {
	res := PagesResult{}
	defer func() {
		res.LastPage = time.Now()
		res.Done = err == nil
		if err != nil && res.Error == "" {
			res.Error = err.Error()
		}
		writeResult(cfg.Result, res)
		discard(cfg.Discard)
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	cmd := helperCommand(cfg, port)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start CRIU's lazy-pages daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	socket := filepath.Join(cfg.Work, "lazy-pages.socket")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		select {
		case err := <-exited:
			return fmt.Errorf("CRIU's lazy-pages daemon: %v: %s", err, logTail(filepath.Join(cfg.Work, "lazy-pages.log")))
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return errors.New("CRIU's lazy-pages daemon did not start within 30s")
		}
	}
	ready()
	res.Restored = time.Now()
	daemon, err := acceptWithin(ln, pagesIdle)
	if daemon == nil {
		_ = cmd.Process.Kill()
		<-exited
		return cmp.Or(err, errors.New("CRIU's lazy-pages daemon never asked for the pages"))
	}
	agent, err := dialWithin(cfg.Socket, pagesIdle)
	if err != nil {
		daemon.Close()
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("no page stream from the source: %w", err)
	}
	bridge(daemon, agent)
	if err := <-exited; err != nil {
		return fmt.Errorf("CRIU's lazy-pages daemon: %v: %s", err, logTail(filepath.Join(cfg.Work, "lazy-pages.log")))
	}
	return nil
}

// helperCommand is the helper's runc or CRIU, its page server's port
// filled in, in the environment the helper got but for its own variable.
func helperCommand(cfg helperConfig, port int) *exec.Cmd {
	cmd := exec.Command(cfg.Command[0], withPort(cfg.Command[1:], port)...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, helperEnv+"=") })
	return cmd
}

func writeResult(path string, res PagesResult) {
	if path == "" {
		return
	}
	raw, _ := json.Marshal(res)
	tmp := path + ".tmp"
	if os.WriteFile(tmp, raw, 0o600) == nil {
		_ = os.Rename(tmp, path)
	}
}

// bridge copies both ways until both sides are done, closing each side's
// writing half as the other's reading ends.
func bridge(a, b net.Conn) {
	var wg sync.WaitGroup
	half := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Add(2)
	go half(a, b)
	go half(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// Bridge is bridge for the agents, which join a page socket to the
// migration's stream between them.
func Bridge(a, b net.Conn) { bridge(a, b) }

func acceptWithin(ln net.Listener, d time.Duration) (net.Conn, error) {
	type deadliner interface{ SetDeadline(time.Time) error }
	if dl, ok := ln.(deadliner); ok {
		_ = dl.SetDeadline(time.Now().Add(d))
	}
	c, err := ln.Accept()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// dialWithin connects to a Unix socket that may not exist yet.
func dialWithin(path string, d time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(d)
	for {
		c, err := net.Dial("unix", path)
		if err == nil || time.Now().After(deadline) {
			return c, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func withPort(args []string, port int) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, "{{port}}", strconv.Itoa(port))
	}
	return out
}

func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	return tail(b, 8)
}
