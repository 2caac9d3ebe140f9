package ociruntime

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeRunc is an OCI runtime that records each command line it gets, one
// per line, and fails when told to.
const fakeRunc = `#!/bin/sh
echo "$*" >> "$FAKE_RUNC_LOG"
cat > /dev/null
if [ -n "$FAKE_RUNC_FAIL" ]; then echo "criu failed" >&2; exit 1; fi
if [ "$1" = state ]; then echo '{"id":"'"$2"'","pid":42,"status":"running"}'; fi
`

type world struct {
	r      Runtime
	log    string
	bundle string
	rootfs string
}

func newWorld(t *testing.T, annotations map[string]string) world {
	t.Helper()
	dir := t.TempDir()
	w := world{log: filepath.Join(dir, "runc.log"), bundle: filepath.Join(dir, "bundle"), rootfs: filepath.Join(dir, "rootfs")}
	runc := filepath.Join(dir, "runc")
	must(t, os.WriteFile(runc, []byte(fakeRunc), 0o755))
	t.Setenv("FAKE_RUNC_LOG", w.log)
	must(t, os.MkdirAll(w.bundle, 0o755))
	must(t, os.MkdirAll(filepath.Join(w.rootfs, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(w.rootfs, "etc", "gone"), []byte("x"), 0o644))
	spec, _ := json.Marshal(map[string]any{"root": map[string]any{"path": w.rootfs}, "annotations": annotations})
	must(t, os.WriteFile(filepath.Join(w.bundle, "config.json"), spec, 0o644))
	devNull, err := os.Open(os.DevNull)
	must(t, err)
	t.Cleanup(func() { devNull.Close() })
	w.r = Runtime{Runc: runc, Stage: filepath.Join(dir, "stage"), State: filepath.Join(dir, "state"), Stdin: devNull, Stdout: os.Stdout, Stderr: os.Stderr}
	return w
}

// stage puts a checkpoint for id where an agent would: CRIU's images, the
// container's file changes and deletions.
func (w world) stage(t *testing.T, id Identity) string {
	t.Helper()
	dir := StagePath(w.r.Stage, id)
	must(t, os.MkdirAll(filepath.Join(dir, "checkpoint"), 0o700))
	must(t, os.WriteFile(filepath.Join(dir, "checkpoint", "pages-1.img"), []byte("memory"), 0o600))
	var diff bytes.Buffer
	tw := tar.NewWriter(&diff)
	must(t, tw.WriteHeader(&tar.Header{Name: "var/", Typeflag: tar.TypeDir, Mode: 0o755}))
	must(t, tw.WriteHeader(&tar.Header{Name: "var/state", Typeflag: tar.TypeReg, Mode: 0o640, Size: 5}))
	_, _ = tw.Write([]byte("moved"))
	must(t, tw.Close())
	must(t, os.WriteFile(filepath.Join(dir, "rootfs-diff.tar"), diff.Bytes(), 0o600))
	must(t, os.WriteFile(filepath.Join(dir, "deleted.files"), []byte(`["/etc/gone"]`), 0o600))
	return dir
}

// state is what the runtime answers to state for ctr1 before its start
// (restored at create, so the runtime answers it itself).
func (w world) state(t *testing.T) map[string]any {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "state")
	must(t, err)
	defer out.Close()
	r := w.r
	r.Stdout = out
	pass, err := r.Run([]string{"state", "ctr1"})
	if pass || err != nil {
		t.Fatalf("state: pass %v, err %v", pass, err)
	}
	raw, err := os.ReadFile(out.Name())
	must(t, err)
	var st map[string]any
	must(t, json.Unmarshal(raw, &st))
	return st
}

func (w world) calls(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(w.log)
	if os.IsNotExist(err) {
		return nil
	}
	must(t, err)
	return strings.Split(strings.TrimSpace(string(raw)), "\n")
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var (
	crioContainer = map[string]string{"io.kubernetes.cri-o.ContainerType": "container", "io.kubernetes.pod.namespace": "shop", "io.kubernetes.pod.name": "consumer-2", "io.kubernetes.pod.uid": targetUID, "io.kubernetes.container.name": "app"}
	containerdApp = map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "shop", "io.kubernetes.cri.sandbox-name": "consumer-2", "io.kubernetes.cri.sandbox-uid": targetUID, "io.kubernetes.cri.container-name": "app"}
	app           = Identity{Namespace: "shop", Pod: "consumer-2", UID: targetUID, Container: "app"}
)

const (
	targetUID = "0b4f6c2e-7a1d-4c3b-9e8f-5d6a7b8c9d0e"
	// laterUID is a pod's that took the target's name after the target went.
	laterUID = "9f8e7d6c-5b4a-4321-8765-43210fedcba9"
)

// The shims' command lines (containerd's runc shim, then CRI-O's conmon).
func createArgs(bundle string) []string {
	return []string{"--root", "/run/containerd/runc/k8s.io", "--log", "/run/x/log.json", "--log-format", "json", "create", "--bundle", bundle, "--pid-file", "/run/x/init.pid", "--no-new-keyring", "ctr1"}
}

func TestACreateWithAStagedCheckpointRestores(t *testing.T) {
	for name, annotations := range map[string]map[string]string{"cri-o": crioContainer, "containerd": containerdApp} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, annotations)
			staged := w.stage(t, app)
			pass, err := w.r.Run(createArgs(w.bundle))
			if err != nil || pass {
				t.Fatalf("create: pass %v, err %v; want a restore", pass, err)
			}
			claimed := staged + ".claimed-ctr1"
			want := "--root /run/containerd/runc/k8s.io --log /run/x/log.json --log-format json restore --detach --image-path " +
				filepath.Join(claimed, "checkpoint") + " --work-path " + claimed + " --bundle " + w.bundle + " --pid-file /run/x/init.pid ctr1"
			if got := w.calls(t); !slices.Equal(got, []string{want}) {
				t.Fatalf("runc got\n%q\nwant\n%q", got, want)
			}
			if b, err := os.ReadFile(filepath.Join(w.rootfs, "var", "state")); err != nil || string(b) != "moved" {
				t.Errorf("the container's changed file: %q, %v", b, err)
			}
			if _, err := os.Stat(filepath.Join(w.rootfs, "etc", "gone")); !os.IsNotExist(err) {
				t.Errorf("a file the container deleted is back: %v", err)
			}
			// The pod UID's directory goes with its last checkpoint.
			for _, left := range []string{staged, claimed, filepath.Dir(staged)} {
				if _, err := os.Stat(left); !os.IsNotExist(err) {
					t.Errorf("the checkpoint is left at %s", left)
				}
			}
			// Until its start, it is created, as after any create.
			if st := w.state(t); st["status"] != "created" || st["pid"] != float64(42) {
				t.Fatalf("state before its start: %v", st)
			}
			// Its start finds it running: nothing for runc to do, once.
			if pass, err := w.r.Run([]string{"--root", "/r", "start", "ctr1"}); pass || err != nil {
				t.Fatalf("start of the restored container: pass %v, err %v", pass, err)
			}
			if pass, _ := w.r.Run([]string{"--root", "/r", "start", "ctr1"}); !pass {
				t.Error("a second start was not runc's")
			}
			for _, cmd := range [][]string{{"state", "ctr1"}, {"kill", "ctr1", "KILL"}, {"delete", "--force", "ctr1"}, {"exec", "--process", "/p.json", "ctr1"}} {
				if pass, err := w.r.Run(cmd); !pass || err != nil {
					t.Errorf("%v is runc's: pass %v, err %v", cmd, pass, err)
				}
			}
		})
	}
}

// crioPod is a container's annotations as CRI-O writes them for a pod
// (CRI-O copies the pod's annotations, then writes its own keys and the
// kubelet's labels over them) in namespace, named pod, that carries
// podAnnotations.
func crioPod(namespace, pod string, podAnnotations map[string]string) map[string]string {
	a := map[string]string{}
	maps.Copy(a, podAnnotations)
	maps.Copy(a, map[string]string{"io.kubernetes.cri-o.ContainerType": "container", "io.kubernetes.pod.namespace": namespace, "io.kubernetes.pod.name": pod, "io.kubernetes.pod.uid": laterUID, "io.kubernetes.container.name": "app"})
	return a
}

func TestACreateWithoutACheckpointIsRuncs(t *testing.T) {
	cases := map[string]struct {
		cri         string
		annotations map[string]string
	}{
		"nothing staged": {"", crioContainer},
		// The target deleted and a pod of its name created in its place
		// (by one allowed to migrate there): the checkpoint is the
		// target's pod's, by UID, not its name's.
		"a later pod of the target's name":       {CRIO, crioPod("shop", "consumer-2", nil)},
		"a pod of the target's name with no UID": {"", map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "shop", "io.kubernetes.cri.sandbox-name": "consumer-2", "io.kubernetes.cri.container-name": "app"}},
		"the sandbox":                            {"", map[string]string{"io.kubernetes.cri-o.ContainerType": "sandbox", "io.kubernetes.pod.namespace": "shop", "io.kubernetes.pod.name": "consumer-2", "io.kubernetes.container.name": "app"}},
		"another namespace's pod of that name":   {"", map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "attacker", "io.kubernetes.cri.sandbox-name": "consumer-2", "io.kubernetes.cri.container-name": "app"}},
		"a name that leaves the stage":           {"", map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "..", "io.kubernetes.cri.sandbox-name": "shop", "io.kubernetes.cri.container-name": "consumer-2"}},
		// The attack on CRI-O nodes: a pod in another namespace whose own
		// annotations are containerd's keys naming the victim's target.
		"on CRI-O, a pod carrying containerd's keys of the target": {CRIO, crioPod("attacker", "thief", containerdApp)},
		"a pod carrying them, the CRI unnamed":                     {"", crioPod("attacker", "thief", containerdApp)},
		// And on containerd nodes, CRI-O's keys are not containerd's.
		"on containerd, CRI-O's keys of the target": {Containerd, crioContainer},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t, tc.annotations)
			w.r.CRI = tc.cri
			if name != "nothing staged" {
				w.stage(t, app)
			}
			pass, err := w.r.Run(createArgs(w.bundle))
			if !pass || err != nil {
				t.Fatalf("pass %v, err %v: want runc's own create", pass, err)
			}
			if calls := w.calls(t); calls != nil {
				t.Errorf("runc was called for a pass-through: %q", calls)
			}
			if name != "nothing staged" {
				if _, err := os.Stat(StagePath(w.r.Stage, app)); err != nil {
					t.Errorf("the staged checkpoint was touched: %v", err)
				}
			}
			if pass, _ := w.r.Run([]string{"start", "ctr1"}); !pass {
				t.Error("the start of a created container is runc's")
			}
		})
	}
}

// A create that expects a checkpoint waits for it: an attacker's create
// must not wait on (nor take) the target's mark.
func TestAnAttackersCreateIgnoresTheTargetsExpectedMark(t *testing.T) {
	w := newWorld(t, crioPod("attacker", "thief", containerdApp))
	w.r.CRI, w.r.ExpectTimeout = CRIO, time.Minute
	mark := ExpectedPath(w.r.Stage, app)
	must(t, os.MkdirAll(filepath.Dir(mark), 0o700))
	must(t, os.WriteFile(mark, nil, 0o600))
	if pass, err := w.r.Run(createArgs(w.bundle)); !pass || err != nil {
		t.Fatalf("pass %v, err %v: want runc's own create at once", pass, err)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Errorf("the target's mark was touched: %v", err)
	}
}

func TestAFailedRestoreFailsTheCreateAndLeavesNothing(t *testing.T) {
	w := newWorld(t, containerdApp)
	staged := w.stage(t, app)
	t.Setenv("FAKE_RUNC_FAIL", "1")
	pass, err := w.r.Run(createArgs(w.bundle))
	if pass || err == nil {
		t.Fatalf("pass %v, err %v: want the restore's error", pass, err)
	}
	if _, err := os.Stat(staged + ".claimed-ctr1"); !os.IsNotExist(err) {
		t.Error("the checkpoint is left after a failed restore")
	}
	if pass, _ := w.r.Run([]string{"start", "ctr1"}); !pass {
		t.Error("a start after a failed restore must be runc's (which refuses it)")
	}
}

func TestParse(t *testing.T) {
	inv := parse([]string{"--systemd-cgroup", "--root", "/r", "create", "--bundle=/b", "--console-socket", "/s", "--preserve-fds", "2", "id"})
	if inv.command != "create" || inv.id != "id" || !slices.Equal(inv.global, []string{"--systemd-cgroup", "--root", "/r"}) {
		t.Fatalf("%+v", inv)
	}
	got := restoreArgs(inv, "/c")
	want := []string{"--systemd-cgroup", "--root", "/r", "restore", "--detach", "--image-path", "/c/checkpoint", "--work-path", "/c", "--bundle=/b", "--console-socket", "/s", "id"}
	if !slices.Equal(got, want) {
		t.Fatalf("restore args\n%q\nwant\n%q", got, want)
	}
}

// TestACreateExpectingACheckpointWaitsForIt: the target pod of a migration
// is created before its checkpoint exists; its container's create waits for
// the checkpoint and restores it, and never starts afresh while one is
// expected: not when the migration gives up (the mark goes), nor when the
// wait runs out.
func TestACreateExpectingACheckpointWaitsForIt(t *testing.T) {
	expect := func(t *testing.T, w world) string {
		t.Helper()
		must(t, os.MkdirAll(filepath.Dir(ExpectedPath(w.r.Stage, app)), 0o700))
		must(t, os.WriteFile(ExpectedPath(w.r.Stage, app), nil, 0o600))
		return ExpectedPath(w.r.Stage, app)
	}
	type result struct {
		pass bool
		err  error
	}
	create := func(w world) <-chan result {
		done := make(chan result, 1)
		go func() {
			pass, err := w.r.Run(createArgs(w.bundle))
			done <- result{pass, err}
		}()
		return done
	}

	t.Run("arrives", func(t *testing.T) {
		w := newWorld(t, containerdApp)
		marker := expect(t, w)
		done := create(w)
		select {
		case r := <-done:
			t.Fatalf("the create did not wait for the checkpoint: %+v", r)
		case <-time.After(200 * time.Millisecond):
		}
		// An agent stages it whole, by a rename.
		elsewhere := w.stage(t, Identity{Namespace: "shop", Pod: "consumer-2", UID: targetUID, Container: "receiving"})
		must(t, os.Rename(elsewhere, StagePath(w.r.Stage, app)))
		if r := <-done; r.pass || r.err != nil {
			t.Fatalf("create: %+v; want the restore", r)
		}
		if calls := w.calls(t); len(calls) != 1 || !strings.Contains(calls[0], " restore ") {
			t.Fatalf("runc got %q", calls)
		}
		if _, err := os.Stat(marker); !os.IsNotExist(err) {
			t.Errorf("the mark is left: %v", err)
		}
	})
	t.Run("the migration gives up", func(t *testing.T) {
		w := newWorld(t, containerdApp)
		marker := expect(t, w)
		done := create(w)
		time.Sleep(50 * time.Millisecond) // let it wait; it must not matter when the mark goes
		must(t, os.Remove(marker))
		if r := <-done; r.pass || r.err == nil || !strings.Contains(r.err.Error(), "ended without one") {
			t.Fatalf("create: %+v; want an error", r)
		}
		if calls := w.calls(t); calls != nil {
			t.Fatalf("runc was called: %q", calls)
		}
	})
	// A StatefulSet's pod is staged before the pod that keeps its name
	// exists: unbound, it holds the create as a mark does, until the
	// migration binds it to the new pod's UID.
	t.Run("staged unbound, then bound to this pod", func(t *testing.T) {
		w := newWorld(t, crioContainer)
		unbound := w.stage(t, app.Unbound())
		done := create(w)
		select {
		case r := <-done:
			t.Fatalf("the create did not wait for the binding: %+v", r)
		case <-time.After(200 * time.Millisecond):
		}
		must(t, os.MkdirAll(filepath.Dir(StagePath(w.r.Stage, app)), 0o700))
		must(t, os.Rename(unbound, StagePath(w.r.Stage, app)))
		if r := <-done; r.pass || r.err != nil {
			t.Fatalf("create: %+v; want the restore", r)
		}
	})
	t.Run("staged unbound, then bound to another pod", func(t *testing.T) {
		w := newWorld(t, crioPod("shop", "consumer-2", nil))
		unbound := w.stage(t, app.Unbound())
		done := create(w)
		time.Sleep(50 * time.Millisecond)
		must(t, os.MkdirAll(filepath.Dir(StagePath(w.r.Stage, app)), 0o700))
		must(t, os.Rename(unbound, StagePath(w.r.Stage, app)))
		if r := <-done; r.pass || r.err == nil || !strings.Contains(r.err.Error(), "ended without one") {
			t.Fatalf("create: %+v; want an error, neither a restore nor a fresh start", r)
		}
		if _, err := os.Stat(StagePath(w.r.Stage, app)); err != nil {
			t.Errorf("the checkpoint bound to the target was touched: %v", err)
		}
	})
	t.Run("the wait runs out", func(t *testing.T) {
		w := newWorld(t, containerdApp)
		w.r.ExpectTimeout = 100 * time.Millisecond
		expect(t, w)
		if pass, err := w.r.Run(createArgs(w.bundle)); pass || err == nil || !strings.Contains(err.Error(), "did not arrive") {
			t.Fatalf("pass %v, err %v; want an error", pass, err)
		}
		if calls := w.calls(t); calls != nil {
			t.Fatalf("runc was called: %q", calls)
		}
	})
}

// TestARestoringCreateFillsTheEmptyDirVolumesItMounts: emptyDir data staged
// for the pod is written into the volumes a restoring container mounts
// before runc restores it (its open files there must exist); a volume only
// another container mounts waits for that container's create, and once
// every volume is filled nothing of the data is left staged.
func TestARestoringCreateFillsTheEmptyDirVolumesItMounts(t *testing.T) {
	w := newWorld(t, crioContainer)
	pods := t.TempDir()
	emptyDir := func(name string) string {
		dir := filepath.Join(pods, "uid-1", "volumes", "kubernetes.io~empty-dir", name)
		must(t, os.MkdirAll(dir, 0o777))
		return dir
	}
	scratch, other := emptyDir("scratch"), emptyDir("other")
	writeSpec := func(container string, mounts ...string) {
		annotations := map[string]string{}
		for k, v := range crioContainer {
			annotations[k] = v
		}
		annotations["io.kubernetes.container.name"] = container
		var ms []map[string]string
		for _, m := range mounts {
			ms = append(ms, map[string]string{"destination": "/data/" + filepath.Base(m), "source": m})
		}
		spec, _ := json.Marshal(map[string]any{"root": map[string]any{"path": w.rootfs}, "mounts": ms, "annotations": annotations})
		must(t, os.WriteFile(filepath.Join(w.bundle, "config.json"), spec, 0o644))
	}
	volumes := StagePath(w.r.Stage, Identity{Namespace: "shop", Pod: "consumer-2", UID: targetUID, Container: VolumesKey})
	for name, files := range map[string]map[string]string{"scratch": {"ledger": "1\n2\n", "sub/part": "p"}, "other": {"x": "y"}} {
		for rel, body := range files {
			path := filepath.Join(volumes, "ms2m", "volumes", name, rel)
			must(t, os.MkdirAll(filepath.Dir(path), 0o755))
			must(t, os.WriteFile(path, []byte(body), 0o640))
		}
	}

	w.stage(t, app)
	writeSpec("app", scratch)
	if pass, err := w.r.Run(createArgs(w.bundle)); err != nil || pass {
		t.Fatalf("create of app: pass %v, err %v", pass, err)
	}
	for rel, want := range map[string]string{"ledger": "1\n2\n", "sub/part": "p"} {
		if b, err := os.ReadFile(filepath.Join(scratch, rel)); err != nil || string(b) != want {
			t.Errorf("scratch/%s: %q, %v", rel, b, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(scratch, "ledger")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("the ledger's mode: %v, %v", fi, err)
	}
	if entries, _ := os.ReadDir(other); len(entries) != 0 {
		t.Errorf("app's create filled a volume it does not mount: %v", entries)
	}

	side := Identity{Namespace: "shop", Pod: "consumer-2", UID: targetUID, Container: "side"}
	w.stage(t, side)
	writeSpec("side", other)
	if pass, err := w.r.Run(append(createArgs(w.bundle)[:len(createArgs(w.bundle))-1], "ctr2")); err != nil || pass {
		t.Fatalf("create of side: pass %v, err %v", pass, err)
	}
	if b, err := os.ReadFile(filepath.Join(other, "x")); err != nil || string(b) != "y" {
		t.Errorf("other/x: %q, %v", b, err)
	}
	if _, err := os.Stat(volumes); !os.IsNotExist(err) {
		t.Errorf("the emptyDir data is still staged: %v", err)
	}
}
