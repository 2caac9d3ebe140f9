package ociruntime

import (
	"bufio"
	"cmp"
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
	"sync/atomic"
	"time"
)

// The helpers of lazy pages: this binary, started detached by the
// runtime's checkpoint or create, holding a page session's two ends
// together until it is over (see lazy.go).

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
func helperDump(cfg helperConfig, ready func()) (err error) {
	defer func() {
		res := PagesResult{Done: err == nil, LastPage: time.Now()}
		if err != nil {
			res.Error = err.Error()
		}
		writeResult(cfg.Result, res)
	}()
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
	if len(cfg.Resume) > 0 {
		// Not paused (CRIU found it running): runc says so, and that is
		// as it should be.
		resume := exec.Command(cfg.Resume[0], cfg.Resume[1:]...)
		resume.Stdout, resume.Stderr = os.Stdout, os.Stderr
		_ = resume.Run()
	}
	return err
}

// helperRestore starts CRIU's lazy-pages daemon, tells the runtime once it
// waits for the restore, joins the daemon's connection to the page server
// to the agent's socket, and records how the transfer ended.
func helperRestore(cfg helperConfig, ready func()) (err error) {
	res := PagesResult{UID: cfg.UID}
	defer func() {
		res.LastPage = time.Now()
		res.Done = err == nil
		if err != nil && res.Error == "" {
			res.Error = err.Error()
		}
		writeResult(cfg.Result, res)
		if cfg.Running != "" {
			_ = os.Remove(cfg.Running)
		}
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
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		// A copy that died takes no more pages: its daemon would wait on.
		if watchProcess(cfg.PidFile, stop) {
			_ = cmd.Process.Kill()
		}
	}()
	daemon, err := acceptWithin(ln, pagesIdle)
	if daemon == nil {
		_ = cmd.Process.Kill()
		<-exited
		return cmp.Or(err, errors.New("CRIU's lazy-pages daemon never asked for the pages"))
	}
	agent, err := DialWithin(cfg.Socket, pagesIdle)
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

// watchProcess waits until the process whose PID runc writes to pidFile
// has run and ended (true), or stop closes (false).
func watchProcess(pidFile string, stop <-chan struct{}) bool {
	if pidFile == "" {
		return false
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	pid := 0
	for {
		select {
		case <-stop:
			return false
		case <-tick.C:
		}
		if pid == 0 {
			raw, err := os.ReadFile(pidFile)
			if err != nil {
				continue
			}
			if pid, err = strconv.Atoi(strings.TrimSpace(string(raw))); err != nil {
				pid = 0
				continue
			}
		}
		if !processAlive(pid) {
			return true
		}
	}
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
//
// A session in which nothing moved for pagesStall is over: CRIU's daemon
// asks for pages without pause until it has them all, so silence means an
// end that went away (a target node lost, a copy killed), and ending the
// session resumes the source, whose liveness probe would otherwise fail.
func bridge(a, b net.Conn) {
	var wg sync.WaitGroup
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	half := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, activity{src, &last})
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(pagesStall / 10)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if time.Since(time.Unix(0, last.Load())) > pagesStall {
					a.Close()
					b.Close()
					return
				}
			}
		}
	}()
	wg.Add(2)
	go half(a, b)
	go half(b, a)
	wg.Wait()
	close(done)
	a.Close()
	b.Close()
}

// activity notes the time of each read that moved bytes.
type activity struct {
	net.Conn
	last *atomic.Int64
}

func (c activity) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.last.Store(time.Now().UnixNano())
	}
	return n, err
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

// DialWithin connects to a Unix socket that may not exist yet, trying
// until d has passed (the runtime's binary links no client-go to poll with).
func DialWithin(path string, d time.Duration) (net.Conn, error) {
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
