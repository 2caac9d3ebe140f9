// Package ociruntime is the OCI runtime behind kubectl-migrate's
// RuntimeClass, for nodes whose container runtime no longer restores
// checkpoints through the CRI (containerd 2.4 removed it; CRI-O can be set
// to checkpoint only). It hands every command to the node's runc, except
// the create of a container for which a migration's agent staged a
// checkpoint: that create becomes a CRIU restore (runc restore) into the new
// container's bundle, as CRI-O and containerd do inside, and the start that
// follows has nothing left to do. To the shim and the kubelet the container
// is like any other: its pid file, stdio, state, kill, exec and delete are
// runc's. A container with no staged checkpoint, and every later restart,
// starts as it would under runc.
package ociruntime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Where the runtime finds and keeps things on a node.
const (
	// StageDir is where a migration's target agent puts each checkpoint,
	// extracted (StagePath). Only root reads it: a checkpoint is a
	// process's memory.
	StageDir = "/var/lib/kubectl-migrate/restore"
	// StateDir remembers, until their start, the containers created by a
	// restore (they run already); it is on the node's tmpfs, as runc's own
	// state is, so a reboot forgets both.
	StateDir = "/run/kubectl-migrate/restored"
	// ConfigFile names the runc every command goes to; without it, runc
	// from PATH.
	ConfigFile = "/opt/kubectl-migrate/runtime.json"
	// BinaryName is the name the agent's binary runs under as this runtime.
	BinaryName = "kubectl-migrate-runtime"
	// HandlerName is the runtime handler node-setup registers, and the
	// RuntimeClass that selects it.
	HandlerName = "kubectl-migrate"
	// NodeLabel marks a node where node-setup installed the runtime; the
	// RuntimeClass selects such nodes, and preflight reads it.
	NodeLabel = "kubectl-migrate.io/runtime"
	// ExpectedSuffix marks, beside a container's stage path, a checkpoint
	// on its way (ExpectedPath).
	ExpectedSuffix = ".expected"
	// VolumesKey stands for a pod's emptyDir data where a container's name
	// would (StagePath): no container has it, as container names are DNS
	// labels, which have no dots.
	VolumesKey = "ms2m.volumes"
	// ExpectTimeout bounds one create's wait for an expected checkpoint,
	// well inside the kubelet's 2-minute limit on a runtime call; the
	// kubelet's next try waits again.
	ExpectTimeout = 90 * time.Second
)

// The CRI runtimes that run this runtime, as nodes name them
// (nodeInfo.containerRuntimeVersion): each writes a container's identity
// into its bundle under keys of its own.
const (
	Containerd = "containerd"
	CRIO       = "cri-o"
)

// Config is ConfigFile's content.
type Config struct {
	// Runc is the OCI runtime every command goes to: the one the node's
	// default handler uses.
	Runc string `json:"runc"`
	// CRI is the CRI runtime that runs this one (Containerd or CRIO): a
	// container's identity is read from its keys alone (identityOf).
	CRI string `json:"cri,omitempty"`
}

// Runtime runs one invocation.
type Runtime struct {
	Runc  string
	Stage string
	State string
	// CRI is Config.CRI: the runtime whose keys name a container.
	CRI string
	// ExpectTimeout bounds the wait for an expected checkpoint (default
	// the package's ExpectTimeout).
	ExpectTimeout time.Duration
	// SharedNetwork keeps lazy pages' helpers in this process's network
	// namespace (tests, which may not make one); on a node each gets its
	// own.
	SharedNetwork bool
	// Stdio of the invocation: a restore hands them to runc as they are,
	// so CRIU reattaches the restored process's stdio to the shim's pipes.
	Stdin          *os.File
	Stdout, Stderr *os.File
}

// New is the runtime as a node has it: ConfigFile, StageDir, StateDir.
func New() (Runtime, error) {
	r := Runtime{Stage: StageDir, State: StateDir, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	raw, err := os.ReadFile(ConfigFile)
	switch {
	case err == nil:
		var c Config
		if err := json.Unmarshal(raw, &c); err != nil {
			return r, fmt.Errorf("%s: %w", ConfigFile, err)
		}
		r.Runc, r.CRI = c.Runc, c.CRI
	case !errors.Is(err, fs.ErrNotExist):
		return r, err
	}
	if r.Runc == "" {
		if r.Runc, err = exec.LookPath("runc"); err != nil {
			return r, fmt.Errorf("no runc on PATH and none named in %s: %w", ConfigFile, err)
		}
	}
	return r, nil
}

// invocation is runc's command line: global flags, the command, its flags
// and the container's ID last.
type invocation struct {
	global  []string
	command string
	flags   []string
	id      string
}

// globalWithValue are runc's global flags that take a value.
var globalWithValue = map[string]bool{"--root": true, "--log": true, "--log-format": true, "--criu": true, "--rootless": true}

func parse(args []string) invocation {
	var inv invocation
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		inv.global = append(inv.global, args[i])
		if globalWithValue[args[i]] && i+1 < len(args) {
			i++
			inv.global = append(inv.global, args[i])
		}
	}
	if i < len(args) {
		inv.command = args[i]
		rest := args[i+1:]
		if len(rest) > 0 && !strings.HasPrefix(rest[len(rest)-1], "-") {
			inv.id, rest = rest[len(rest)-1], rest[:len(rest)-1]
		}
		inv.flags = rest
	}
	return inv
}

// value is the value of flag (any of names) in flags, as "--f v" or "--f=v".
func value(flags []string, names ...string) (string, bool) {
	for i, f := range flags {
		for _, n := range names {
			if f == n && i+1 < len(flags) {
				return flags[i+1], true
			}
			if v, ok := strings.CutPrefix(f, n+"="); ok {
				return v, true
			}
		}
	}
	return "", false
}

// Run does what the runtime changes: the create of a container with a
// staged checkpoint restores it; the start of a restored container does
// nothing (it runs). passThrough means the invocation is runc's as it is:
// the caller then calls Exec.
func (r Runtime) Run(args []string) (passThrough bool, err error) {
	inv := parse(args)
	switch inv.command {
	case "create":
		staged, id, err := r.claim(inv)
		if err != nil || staged == "" {
			return staged == "" && err == nil, err
		}
		if isLazy(staged) {
			return false, r.restoreLazily(inv, id, staged)
		}
		return false, r.restore(inv, staged)
	case "checkpoint":
		lazy, err := r.checkpointLazily(inv)
		return !lazy, err
	case "start":
		marker := filepath.Join(r.State, inv.id)
		if inv.id != "" && os.Remove(marker) == nil {
			return false, nil // restored at create: it runs already
		}
	case "state":
		if inv.id != "" && !strings.ContainsAny(inv.id, `/\`) {
			if _, err := os.Stat(filepath.Join(r.State, inv.id)); err == nil {
				return false, r.stateAsCreated(args)
			}
		}
	case "delete":
		if inv.id != "" {
			_ = os.Remove(filepath.Join(r.State, inv.id))
		}
	}
	return true, nil
}

// LogError records err where the caller reads runc's errors: the file of
// runc's --log in its JSON format (containerd's shim reports its last
// error line), and stderr (CRI-O's conmon reports it).
func LogError(args []string, err error) {
	fmt.Fprintln(os.Stderr, BinaryName+":", err)
	path, ok := value(parse(args).global, "--log")
	if !ok {
		return
	}
	line, _ := json.Marshal(map[string]string{"level": "error", "msg": BinaryName + ": " + err.Error(), "time": time.Now().UTC().Format(time.RFC3339Nano)})
	f, openErr := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if openErr != nil {
		return
	}
	defer f.Close()
	_, _ = f.Write(append(line, '\n'))
}

// bundleSpec is the part of a bundle's config.json the runtime reads.
type bundleSpec struct {
	Root struct {
		Path string `json:"path"`
	} `json:"root"`
	Mounts      []bundleMount     `json:"mounts"`
	Annotations map[string]string `json:"annotations"`
}

type bundleMount struct {
	Destination string `json:"destination"`
	Source      string `json:"source"`
}

// Identity is a container's place in the cluster, from the annotations its
// CRI runtime puts into its bundle. UID is its pod's: a checkpoint staged
// for one UID is restored into that pod only, never into a pod that takes
// the name later (the target deleted and another created in its place).
type Identity struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	UID       string `json:"uid,omitempty"`
	Container string `json:"container"`
}

// Unbound is id without its pod's UID: how a checkpoint staged before its
// pod exists is named, until the migration binds it (BoundPath).
func (id Identity) Unbound() Identity { id.UID = ""; return id }

// identityOf reads the identity that cri (Containerd, CRIO, or "" for
// whichever set its own marker) wrote into a container's annotations; a
// sandbox (the pod's pause container) has none to restore.
//
// Only the keys the runtime sets itself count, because the rest come from
// the pod: CRI-O copies every pod annotation into each container's spec,
// then writes its own keys and the kubelet's container labels (pod name,
// namespace, container name) over them; containerd passes through only
// the pod annotations its handler lists (node-setup's lists what the
// default handler does), and writes its io.kubernetes.cri.* keys after
// them. A pod on a CRI-O node that carries containerd's keys naming
// another namespace's target is read by CRI-O's, and is itself.
func identityOf(cri string, a map[string]string) (Identity, bool) {
	if cri == "" {
		// CRI-O always sets its container type, over any pod annotation.
		cri = Containerd
		if _, ok := a["io.kubernetes.cri-o.ContainerType"]; ok {
			cri = CRIO
		}
	}
	switch cri {
	case Containerd:
		if a["io.kubernetes.cri.container-type"] == "container" {
			return Identity{Namespace: a["io.kubernetes.cri.sandbox-namespace"], Pod: a["io.kubernetes.cri.sandbox-name"], UID: a["io.kubernetes.cri.sandbox-uid"], Container: a["io.kubernetes.cri.container-name"]}, true
		}
	case CRIO:
		if a["io.kubernetes.cri-o.ContainerType"] == "container" {
			return Identity{Namespace: a["io.kubernetes.pod.namespace"], Pod: a["io.kubernetes.pod.name"], UID: a["io.kubernetes.pod.uid"], Container: a["io.kubernetes.container.name"]}, true
		}
	}
	return Identity{}, false
}

// IdentityOf is identityOf for callers outside the runtime: the agent
// reads a checkpoint archive's spec.dump with it.
func IdentityOf(cri string, annotations map[string]string) (Identity, bool) {
	return identityOf(cri, annotations)
}

// Valid refuses an identity whose parts could leave the stage directory.
func (id Identity) Valid() error {
	parts := []string{id.Namespace, id.Pod, id.Container}
	if id.UID != "" {
		parts = append(parts, id.UID)
	}
	for _, p := range parts {
		// No name in the cluster starts with a dot; the stage's own
		// directories do (UIDPrefix).
		if p == "" || strings.HasPrefix(p, ".") || strings.ContainsAny(p, `/\`) {
			return fmt.Errorf("%q cannot name a pod's checkpoint", p)
		}
	}
	return nil
}

// Main runs the runtime as the shim calls it (as it calls runc) and returns
// the exit status: cmd/kubectl-migrate-runtime's main, and the agent's when
// node-setup installed the agent's binary under BinaryName.
func Main(args []string) int {
	if status, ok := HelperMain(); ok {
		return status
	}
	r, err := New()
	if err != nil {
		LogError(args, err)
		return 1
	}
	passThrough, err := r.Run(args)
	if err != nil {
		LogError(args, err)
		return 1
	}
	if passThrough {
		err := r.Exec(args)
		fmt.Fprintln(os.Stderr, BinaryName+": exec", r.Runc+":", err)
		return 127
	}
	return 0
}
