// Package nodesetup installs the kubectl-migrate runtime on a node and
// removes it again, from the agent pod that kubectl migrate node-setup runs
// there: the runtime's binary (the agent's own), the file naming the runc
// it hands commands to, a drop-in file registering the kubectl-migrate
// handler with the node's container runtime (containerd 2.x or CRI-O), and
// a restart of that runtime so it loads the handler, checked through the
// CRI: the runtime lists the handler, or no longer does. Only files of its
// own are written or removed; the runtime's own configuration is read,
// never changed. Its cluster half (Cluster) is what the plugin changes
// through the API server around each node's setup.
package nodesetup

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// Files node-setup owns on a node.
const (
	Dir    = "/opt/kubectl-migrate" // the binary and runtime.json
	BinDir = Dir + "/bin"
	// HostRun is where the agent sees the node's /run: the runtime's
	// socket (a restarted runtime makes a new one, which a mount of the
	// socket itself would not show) and systemd's.
	HostRun        = "/host/run"
	ContainerdDir  = "/etc/containerd"
	CRIODir        = "/etc/crio"
	containerdFile = ContainerdDir + "/conf.d/kubectl-migrate.toml"
	crioFile       = CRIODir + "/crio.conf.d/99-kubectl-migrate.conf"
)

// Runtime names as nodes report them (nodeInfo.containerRuntimeVersion).
const (
	Containerd = ociruntime.Containerd
	CRIO       = ociruntime.CRIO
)

// Restarts.
const (
	// RestartAuto is RestartSystemd where systemd runs the node, else
	// RestartSignal.
	RestartAuto = "auto"
	// RestartSystemd asks systemd over D-Bus to restart the runtime's unit
	// (containerd.service, crio.service), as systemctl restart does:
	// running containers keep running, their shims and monitors do not
	// depend on the daemon.
	RestartSystemd = "systemd"
	// RestartSignal stops the runtime with SIGTERM and waits for whatever
	// supervises it to start it again: for service managers that always
	// restart it.
	RestartSignal = "signal"
)

// Options say what to do on this node.
type Options struct {
	Runtime   string // Containerd or CRIO
	Uninstall bool
	Restart   string
	// Socket is the runtime's CRI socket as the agent sees it
	// (SocketUnder).
	Socket string
	// Root prefixes every host path (tests); "" in the agent, where the
	// host's paths are mounted at their own.
	Root string
	// Self is the binary installed as the runtime (the running agent).
	Self string
	// Handlers lists the runtime's handlers over CRI (tests replace it).
	Handlers func(ctx context.Context) ([]string, error)
	// Timeout bounds the wait for the restarted runtime (default 2 min).
	Timeout time.Duration

	restartHook func(context.Context) error // tests: instead of a restart
}

func (o Options) host(path string) string { return filepath.Join(o.Root, path) }

// Run installs or uninstalls, and says what it did in one line.
func Run(ctx context.Context, o Options) (string, error) {
	dropIn, content, err := o.dropIn()
	if err != nil {
		return "", err
	}
	if o.Uninstall {
		return o.uninstall(ctx, dropIn)
	}
	if err := o.installFiles(dropIn, content); err != nil {
		return "", err
	}
	if err := o.restart(ctx, true); err != nil {
		return "", err
	}
	return fmt.Sprintf("installed: %s lists handler %s", o.Runtime, ociruntime.HandlerName), nil
}

func (o Options) uninstall(ctx context.Context, dropIn string) (string, error) {
	err := os.Remove(o.host(dropIn))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if err == nil {
		if err := o.restart(ctx, false); err != nil {
			return "", err
		}
	}
	if created, err := os.ReadFile(o.host(createdDirFile)); err == nil && string(created) == filepath.Dir(dropIn) {
		_ = os.Remove(o.host(string(created))) // only if empty
	}
	for _, p := range []string{filepath.Join(BinDir, ociruntime.BinaryName), ociruntime.ConfigFile, createdDirFile} {
		if err := os.Remove(o.host(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	for _, d := range []string{BinDir, Dir} {
		_ = os.Remove(o.host(d)) // only if empty
	}
	return fmt.Sprintf("uninstalled: %s no longer lists handler %s", o.Runtime, ociruntime.HandlerName), nil
}

// installFiles writes the binary, its runc file and the drop-in, each
// whole (a rename): a runtime reading one mid-write sees the old or the new.
func (o Options) installFiles(dropIn, content string) error {
	self, err := os.Open(o.Self)
	if err != nil {
		return err
	}
	defer self.Close()
	if err := writeAtomic(o.host(filepath.Join(BinDir, ociruntime.BinaryName)), self, 0o755); err != nil {
		return fmt.Errorf("install the runtime: %w", err)
	}
	// A drop-in directory the node did not have goes again on uninstall.
	if _, err := os.Stat(o.host(filepath.Dir(dropIn))); errors.Is(err, fs.ErrNotExist) {
		if err := os.WriteFile(o.host(createdDirFile), []byte(filepath.Dir(dropIn)), 0o644); err != nil {
			return err
		}
	}
	return writeAtomic(o.host(dropIn), strings.NewReader(content), 0o644)
}

// createdDirFile names the drop-in directory install created, if it did.
const createdDirFile = Dir + "/created-dir"

func writeAtomic(path string, r io.Reader, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Chmod(tmp, perm)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// dropIn is the runtime's drop-in file and its content, made from the
// runtime's default handler (its runc, cgroup driver, monitor), which the
// kubectl-migrate runtime hands every command to. It also writes
// ociruntime.ConfigFile when installing.
func (o Options) dropIn() (path, content string, err error) {
	switch o.Runtime {
	case Containerd:
		return o.containerdDropIn()
	case CRIO:
		return o.crioDropIn()
	}
	return "", "", fmt.Errorf("runtime %q: node-setup knows containerd 2.x and CRI-O", o.Runtime)
}

func (o Options) containerdDropIn() (string, string, error) {
	main := filepath.Join(ContainerdDir, "config.toml")
	var cfg struct {
		Version int                       `toml:"version"`
		Imports []string                  `toml:"imports"`
		Plugins map[string]toml.Primitive `toml:"plugins"`
	}
	md, err := toml.DecodeFile(o.host(main), &cfg)
	if err != nil {
		return "", "", fmt.Errorf("read %s: %w", main, err)
	}
	if !slices.ContainsFunc(cfg.Imports, func(p string) bool { ok, _ := filepath.Match(p, containerdFile); return ok }) {
		return "", "", fmt.Errorf(`%s does not import %s: add imports = ["%s/conf.d/*.toml"] (containerd's default configuration has it) and run node-setup again`, main, containerdFile, ContainerdDir)
	}
	plugin := "io.containerd.cri.v1.runtime" // version 3
	if cfg.Version < 3 {
		plugin = "io.containerd.grpc.v1.cri"
	}
	var cri struct {
		Containerd struct {
			Default  string                    `toml:"default_runtime_name"`
			Runtimes map[string]toml.Primitive `toml:"runtimes"`
		} `toml:"containerd"`
	}
	if p, ok := cfg.Plugins[plugin]; ok {
		if err := md.PrimitiveDecode(p, &cri); err != nil {
			return "", "", fmt.Errorf("read %s's %s: %w", main, plugin, err)
		}
	}
	// The handler is the default one but for its runc: every other
	// setting (cgroups, devices, base spec, annotations it passes) is kept,
	// so a pod under the RuntimeClass is confined as any other.
	handler := map[string]any{}
	if p, ok := cri.Containerd.Runtimes[cmp.Or(cri.Containerd.Default, "runc")]; ok {
		if err := md.PrimitiveDecode(p, &handler); err != nil {
			return "", "", fmt.Errorf("read %s's default handler: %w", main, err)
		}
	}
	if t, _ := handler["runtime_type"].(string); t != "" && t != "io.containerd.runc.v2" {
		return "", "", fmt.Errorf("containerd's default handler runs %s; the kubectl-migrate runtime wraps runc (io.containerd.runc.v2)", t)
	}
	options, _ := handler["options"].(map[string]any)
	if options == nil {
		options = map[string]any{}
	}
	runc, _ := options["BinaryName"].(string)
	if err := o.writeRuncConfig(runc); err != nil {
		return "", "", err
	}
	handler["runtime_type"] = "io.containerd.runc.v2"
	options["BinaryName"] = filepath.Join(BinDir, ociruntime.BinaryName)
	handler["options"] = options
	body, err := encodeTOML(map[string]any{
		"version": max(cfg.Version, 2),
		"plugins": map[string]any{plugin: map[string]any{"containerd": map[string]any{"runtimes": map[string]any{ociruntime.HandlerName: handler}}}},
	})
	if err != nil {
		return "", "", err
	}
	content := dropInHeader + body
	return containerdFile, content, nil
}

func (o Options) crioDropIn() (string, string, error) {
	// CRI-O reads crio.conf, then the drop-ins in name order, the later
	// winning: the default handler is the last word on it.
	files := []string{filepath.Join(CRIODir, "crio.conf")}
	dropIns, _ := filepath.Glob(o.host(filepath.Join(CRIODir, "crio.conf.d", "*.conf")))
	for _, d := range dropIns {
		if rel := strings.TrimPrefix(d, o.Root); rel != crioFile {
			files = append(files, rel)
		}
	}
	defaultRuntime := "crun" // CRI-O's default since 1.31
	handlers := map[string]map[string]any{}
	for _, f := range files {
		var cfg struct {
			Crio struct {
				Runtime struct {
					Default  string                    `toml:"default_runtime"`
					Runtimes map[string]map[string]any `toml:"runtimes"`
				} `toml:"runtime"`
			} `toml:"crio"`
		}
		if _, err := toml.DecodeFile(o.host(f), &cfg); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return "", "", fmt.Errorf("read %s: %w", f, err)
		}
		if d := cfg.Crio.Runtime.Default; d != "" {
			defaultRuntime = d
		}
		for name, h := range cfg.Crio.Runtime.Runtimes {
			if handlers[name] == nil {
				handlers[name] = map[string]any{}
			}
			maps.Copy(handlers[name], h)
		}
	}
	// The handler is the default one but for its runtime_path: its
	// monitor, allowed annotations, cgroups and the rest are kept.
	handler := handlers[defaultRuntime]
	if handler == nil {
		handler = map[string]any{}
	}
	if t, _ := handler["runtime_type"].(string); t != "" && t != "oci" {
		return "", "", fmt.Errorf("CRI-O's default handler %s is of type %s; the kubectl-migrate runtime wraps an OCI runtime (runtime_type oci)", defaultRuntime, t)
	}
	path, _ := handler["runtime_path"].(string)
	if err := o.writeRuncConfig(cmp.Or(path, defaultRuntime)); err != nil {
		return "", "", err
	}
	handler["runtime_path"] = filepath.Join(BinDir, ociruntime.BinaryName)
	handler["runtime_type"] = "oci"
	body, err := encodeTOML(map[string]any{"crio": map[string]any{"runtime": map[string]any{"runtimes": map[string]any{ociruntime.HandlerName: handler}}}})
	if err != nil {
		return "", "", err
	}
	content := dropInHeader + body
	return crioFile, content, nil
}

const dropInHeader = "# Written by kubectl migrate node-setup; removed by node-setup --uninstall.\n"

func encodeTOML(v any) (string, error) {
	var b strings.Builder
	if err := toml.NewEncoder(&b).Encode(v); err != nil {
		return "", err
	}
	return b.String(), nil
}

// writeRuncConfig names the runtime commands go to; a bare name is looked
// up on the PATH the shim runs the runtime with.
func (o Options) writeRuncConfig(runc string) error {
	if o.Uninstall {
		return nil
	}
	// No runc named: the one on PATH. The CRI runtime named: a container
	// is known by its keys alone.
	content, err := json.Marshal(ociruntime.Config{Runc: runc, CRI: o.Runtime})
	if err != nil {
		return err
	}
	return writeAtomic(o.host(ociruntime.ConfigFile), bytes.NewReader(append(content, '\n')), 0o644)
}

// restart restarts the runtime and waits until it answers over CRI with
// the handler listed (installed) or not (uninstalled).
func (o Options) restart(ctx context.Context, installed bool) error {
	how := o.Restart
	if how == "" || how == RestartAuto {
		how = RestartSignal
		if _, err := os.Stat(o.host(HostRun + "/systemd/system")); err == nil {
			how = RestartSystemd
		}
	}
	var err error
	switch {
	case o.restartHook != nil:
		err = o.restartHook(ctx)
	case how == RestartSystemd:
		err = restartUnit(ctx, o.host(HostRun+"/systemd/private"), map[string]string{Containerd: "containerd.service", CRIO: "crio.service"}[o.Runtime])
	case how == RestartSignal:
		err = o.signalRuntime(ctx)
	default:
		err = fmt.Errorf("--restart %q: use auto, systemd or signal", o.Restart)
	}
	if err != nil {
		return fmt.Errorf("restart %s: %w", o.Runtime, err)
	}
	var last error
	waitErr := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, cmp.Or(o.Timeout, 2*time.Minute), true, func(ctx context.Context) (bool, error) {
		handlers, err := o.Handlers(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		last = nil
		return slices.Contains(handlers, ociruntime.HandlerName) == installed, nil
	})
	if waitErr != nil {
		want := "lists"
		if !installed {
			want = "no longer lists"
		}
		return fmt.Errorf("%s restarted but never %s handler %s (%v); see its log", o.Runtime, want, ociruntime.HandlerName, cmp.Or(last, waitErr))
	}
	return nil
}

// statIn stats path as the process whose root is root sees it: symbolic
// links on the way (/var/run → /run) resolve in that root, not in the
// agent's (os.Root refuses absolute ones).
func statIn(root, path string) (os.FileInfo, error) {
	resolved := "/"
	rest := strings.Split(strings.Trim(path, "/"), "/")
	for hops := 0; len(rest) > 0; {
		next := filepath.Join(resolved, rest[0])
		rest = rest[1:]
		info, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return nil, err
		}
		if info.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if hops++; hops > 40 {
			return nil, fmt.Errorf("%s: too many links", path)
		}
		link, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return nil, err
		}
		if !filepath.IsAbs(link) {
			link = filepath.Join(resolved, link)
		}
		rest = append(strings.Split(strings.Trim(filepath.Clean(link), "/"), "/"), rest...)
		resolved = "/"
	}
	return os.Stat(filepath.Join(root, resolved))
}

// SocketUnder is where the runtime's socket is, under run (the node's
// /run, mounted): /var/run is /run on every node.
func SocketUnder(run, runtime string) string {
	return filepath.Join(run, map[string]string{Containerd: "containerd/containerd.sock", CRIO: "crio/crio.sock"}[runtime])
}

// runtimeSocketOnHost is the socket's path on the node.
func (o Options) runtimeSocketOnHost() string { return SocketUnder("/run", o.Runtime) }
