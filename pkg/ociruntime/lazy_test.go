package ociruntime

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The test binary stands in for the runtime's helpers (as the runtime
// starts itself) and for runc and CRIU's lazy-pages daemon (fakeRole).
func TestMain(m *testing.M) {
	if status, ok := HelperMain(); ok {
		os.Exit(status)
	}
	if role := os.Getenv("FAKE_ROLE"); role != "" {
		os.Exit(fake(role, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fake plays runc (state, checkpoint --lazy-pages, restore) and CRIU's
// lazy-pages daemon, over a page protocol of its own: the daemon asks
// "pages?", the page server answers FAKE_PAGES and a newline; the daemon
// writes what it got to FAKE_RECEIVED.
func fake(role string, args []string) int {
	if f, err := os.OpenFile(os.Getenv("FAKE_LOG"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
		fmt.Fprintln(f, role+": "+strings.Join(args, " "))
		f.Close()
	}
	inv := parse(args)
	switch {
	case role == "runc" && inv.command == "state":
		fmt.Printf(`{"id":%q,"pid":42,"status":"running","bundle":%q}`+"\n", inv.id, os.Getenv("FAKE_BUNDLE"))
	case role == "runc" && inv.command == "checkpoint":
		addr, _ := value(inv.flags, "--page-server")
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		os.NewFile(3, "status").Write([]byte{0}) // frozen, serving
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		if line == "pages?\n" {
			fmt.Fprintln(c, os.Getenv("FAKE_PAGES"))
		}
		_, _ = io.Copy(io.Discard, c) // until the daemon hangs up
	case role == "runc" && inv.command == "restore":
	case role == "criu":
		port, _ := value(args, "--port")
		work, _ := value(args, "-W")
		// CRIU names its socket relative to its work directory, whose path
		// may be longer than a socket's.
		if os.Chdir(work) != nil {
			return 1
		}
		sock, err := net.Listen("unix", "lazy-pages.socket")
		if err != nil {
			return 1
		}
		defer sock.Close()
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			return 1
		}
		fmt.Fprint(c, "pages?\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			return 1 // the stream broke before the last page
		}
		_ = os.WriteFile(os.Getenv("FAKE_RECEIVED"), []byte(strings.TrimSpace(line)), 0o600)
	}
	return 0
}

func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lz")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

type lazyWorld struct {
	world
	dir, received string
}

func newLazyWorld(t *testing.T) lazyWorld {
	t.Helper()
	w := lazyWorld{world: newWorld(t, crioContainer), dir: shortTempDir(t)}
	// A Unix socket's path has room for 107 bytes: the stage is short,
	// as a node's is.
	w.r.Stage = filepath.Join(w.dir, "stage")
	self, err := os.Executable()
	must(t, err)
	script := func(role string) string {
		p := filepath.Join(w.dir, role)
		must(t, os.WriteFile(p, []byte("#!/bin/sh\nFAKE_ROLE="+role+" exec "+self+` "$@"`+"\n"), 0o755))
		return p
	}
	w.r.Runc = script("runc")
	w.r.SharedNetwork = true
	w.received = filepath.Join(w.dir, "received")
	t.Setenv("FAKE_LOG", w.log)
	t.Setenv("FAKE_BUNDLE", w.bundle)
	t.Setenv("FAKE_PAGES", "the process's memory")
	t.Setenv("FAKE_RECEIVED", w.received)
	t.Setenv("PATH", w.dir+":"+os.Getenv("PATH"))
	script("criu")
	return w
}

// checkpoint makes the CRI runtime's checkpoint call for ctr1 into images.
func (w lazyWorld) checkpoint(t *testing.T) (images string, pass bool, err error) {
	t.Helper()
	images = filepath.Join(w.dir, "userdata", "checkpoint")
	must(t, os.MkdirAll(images, 0o700))
	pass, err = w.r.Run([]string{"--root", "/run/runc", "checkpoint", "--file-locks", "--image-path", images, "--work-path", filepath.Dir(images), "--leave-running", "ctr1"})
	return images, pass, err
}

// stageLazy stages on the target what the CRI runtime archived: CRIU's
// images with the lazy mark.
func (w lazyWorld) stageLazy(t *testing.T, images string) string {
	t.Helper()
	staged := w.stage(t, app)
	must(t, os.CopyFS(filepath.Join(staged, "checkpoint"), os.DirFS(images)))
	return staged
}

// cutStream stands for an agent whose stream from the source breaks as
// the restorer connects.
func cutStream(t *testing.T, stage string, id Identity) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(stage, PagesDir), 0o700))
	ln, err := net.Listen("unix", PagesSocket(stage, id.Unbound()))
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
}

func waitResult(t *testing.T, stage string, id Identity) PagesResult {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		res, ok, err := ReadPagesResult(stage, id.Unbound())
		must(t, err)
		if ok {
			return res
		}
	}
	t.Fatal("the lazy restore recorded no result within 20s")
	return PagesResult{}
}

// TestLazyPagesGoFromTheFrozenSourceToTheCopy: a checkpoint its migration
// asked to be lazy leaves the pages in the source, and the create that
// restores it runs runc restore --lazy-pages while the pages travel from
// the source's page server, through the two page sockets, to the daemon;
// the target records that the last page arrived.
func TestLazyPagesGoFromTheFrozenSourceToTheCopy(t *testing.T) {
	w := newLazyWorld(t)
	// The source's node and the target's: one pod's name, two stages.
	src := Identity{Namespace: "shop", Pod: "consumer-2", UID: targetUID, Container: "app"}
	must(t, os.MkdirAll(filepath.Dir(LazyRequestPath(w.r.Stage, src)), 0o700))
	must(t, os.WriteFile(LazyRequestPath(w.r.Stage, src), nil, 0o600))
	images, pass, err := w.checkpoint(t)
	if pass || err != nil {
		t.Fatalf("checkpoint: pass %v, err %v; want a lazy checkpoint", pass, err)
	}
	if _, err := os.Stat(LazyRequestPath(w.r.Stage, src)); !os.IsNotExist(err) {
		t.Errorf("the request outlived the checkpoint it asked for: %v", err)
	}
	if !isLazy(filepath.Dir(images)) {
		t.Fatal("the checkpoint is not marked lazy")
	}
	w2 := w
	w2.r.Stage = filepath.Join(w.dir, "tstage")
	staged := w2.stageLazy(t, images)
	agentsBetween(t, PagesSocket(w.r.Stage, src), w2.r.Stage, app)
	pass, err = w2.r.Run(createArgs(w2.bundle))
	if pass || err != nil {
		t.Fatalf("create: pass %v, err %v; want a lazy restore", pass, err)
	}
	res := waitResult(t, w2.r.Stage, app)
	if !res.Done || res.Error != "" || res.LastPage.Before(res.Restored) {
		t.Fatalf("result %+v; want every page arrived", res)
	}
	// The source's session ends too, and the source is thawed: CRIU
	// froze it back as the CRI runtime had paused it.
	if src := waitResult(t, w.r.Stage, src); !src.Done {
		t.Errorf("the source's session: %+v", src)
	}
	if !slices.Contains(w.calls(t), "runc: --root /run/runc resume ctr1") {
		t.Errorf("the source was not resumed after its session: %q", w.calls(t))
	}
	if got, _ := os.ReadFile(w.received); string(got) != "the process's memory" {
		t.Errorf("the daemon got %q", got)
	}
	calls := w.calls(t)
	wantCheckpoint := "runc: --root /run/runc checkpoint --file-locks --image-path " + images + " --work-path " + filepath.Dir(images) + " --leave-running --lazy-pages --page-server 127.0.0.1:"
	if !slices.ContainsFunc(calls, func(c string) bool {
		return strings.HasPrefix(c, wantCheckpoint) && strings.HasSuffix(c, "--status-fd 3 ctr1")
	}) {
		t.Errorf("no lazy checkpoint keeping the CRI runtime's flags in %q", calls)
	}
	if !slices.ContainsFunc(calls, func(c string) bool {
		return strings.HasPrefix(c, "runc: ") && strings.Contains(c, " restore --detach ") && strings.HasSuffix(c, "--lazy-pages ctr1")
	}) {
		t.Errorf("no runc restore --lazy-pages in %q", calls)
	}
	for _, gone := range []string{staged, staged + ".claimed-ctr1"} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("the checkpoint is left at %s", gone)
		}
	}
	if st := w2.state(t); st["status"] != "created" {
		t.Errorf("state before its start: %v", st)
	}
	// Every page arrived: a later restart starts afresh, as any does.
	if pass, err := w2.r.Run(createArgs(w2.bundle)); !pass || err != nil {
		t.Errorf("a restart after the last page: pass %v, err %v", pass, err)
	}
}

// agentsBetween joins the target's page socket to the source's (at
// source), as the two agents do.
func agentsBetween(t *testing.T, source, stage string, id Identity) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Join(stage, PagesDir), 0o700))
	ln, err := net.Listen("unix", PagesSocket(stage, id.Unbound()))
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		restorer, err := ln.Accept()
		if err != nil {
			return
		}
		src, err := net.Dial("unix", source)
		if err != nil {
			restorer.Close()
			return
		}
		Bridge(restorer, src)
	}()
}

// TestALazyRestoreWhoseStreamBreaksIsNotDone: the stream cut before the
// last page; the target records the failure, which the migration rolls
// back on, and the checkpoint goes.
func TestALazyRestoreWhoseStreamBreaksIsNotDone(t *testing.T) {
	w := newLazyWorld(t)
	images := filepath.Join(w.dir, "images")
	must(t, os.MkdirAll(images, 0o700))
	must(t, os.WriteFile(filepath.Join(images, lazyMarker), nil, 0o600))
	staged := w.stageLazy(t, images)
	cutStream(t, w.r.Stage, app)
	if pass, err := w.r.Run(createArgs(w.bundle)); pass || err != nil {
		t.Fatalf("create: pass %v, err %v", pass, err)
	}
	res := waitResult(t, w.r.Stage, app)
	if res.Done || res.Error == "" {
		t.Fatalf("result %+v; want a failure", res)
	}
	if _, err := os.Stat(staged + ".claimed-ctr1"); !os.IsNotExist(err) {
		t.Errorf("the checkpoint is left: %v", err)
	}
	// The kubelet restarts the dead copy: it must not start afresh and
	// take the work its migration gives back to the source.
	if pass, err := w.r.Run(createArgs(w.bundle)); pass || err == nil || !strings.Contains(err.Error(), "does not start afresh") {
		t.Fatalf("a restart of the copy whose pages did not arrive: pass %v, err %v", pass, err)
	}
	// Another pod that takes the name later starts as any does.
	later := newLazyWorld(t)
	later.r.Stage = w.r.Stage
	must(t, os.WriteFile(filepath.Join(later.bundle, "config.json"), []byte(`{"root":{"path":"`+later.rootfs+`"},"annotations":{"io.kubernetes.cri-o.ContainerType":"container","io.kubernetes.pod.namespace":"shop","io.kubernetes.pod.name":"consumer-2","io.kubernetes.pod.uid":"`+laterUID+`","io.kubernetes.container.name":"app"}}`), 0o644))
	if pass, err := later.r.Run(createArgs(later.bundle)); !pass || err != nil {
		t.Fatalf("a later pod of the name: pass %v, err %v", pass, err)
	}
}

// TestACheckpointNobodyAskedToBeLazyIsRuncs: without the request for this
// container's pod (by UID), the checkpoint is runc's, whole.
func TestACheckpointNobodyAskedToBeLazyIsRuncs(t *testing.T) {
	for name, asked := range map[string]*Identity{
		"no request":                   nil,
		"a request for a former pod":   {Namespace: "shop", Pod: "consumer-2", UID: laterUID, Container: "app"},
		"a request for another member": {Namespace: "shop", Pod: "consumer-2", UID: targetUID, Container: "sidecar"},
	} {
		t.Run(name, func(t *testing.T) {
			w := newLazyWorld(t)
			if asked != nil {
				must(t, os.MkdirAll(filepath.Dir(LazyRequestPath(w.r.Stage, *asked)), 0o700))
				must(t, os.WriteFile(LazyRequestPath(w.r.Stage, *asked), nil, 0o600))
			}
			images, pass, err := w.checkpoint(t)
			if !pass || err != nil {
				t.Fatalf("checkpoint: pass %v, err %v; want runc's", pass, err)
			}
			if isLazy(filepath.Dir(images)) {
				t.Error("marked lazy")
			}
		})
	}
}
