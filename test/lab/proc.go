package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// run runs a command to completion and returns its error with its output.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// output runs a command and returns its standard output.
func output(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return strings.TrimSpace(string(out)), err
}

// start launches a long-running daemon in its own session with its output in
// a log file, and records its PID so that down ends exactly it.
func (d dirs) start(name string, argv []string, env []string) error {
	if pid, ok := d.running(name); ok {
		return fmt.Errorf("%s already runs as PID %d", name, pid)
	}
	logf, err := os.OpenFile(d.log(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	// Only stdio is inherited: CRIU cannot dump a process holding fds that
	// point outside its node's root.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = cmd.Wait() }() // reap it if it dies while we run
	pid := cmd.Process.Pid
	// Kept so that restart can start it again the same way (a test that
	// stops the broker or a kubelet brings it back).
	spec, err := json.Marshal(launch{Argv: argv, Env: env})
	if err != nil {
		return err
	}
	if err := os.WriteFile(d.launchFile(name), spec, 0o644); err != nil {
		return err
	}
	// The start time makes the record specific: a PID reused by another
	// process after a reboot is never taken for ours.
	return os.WriteFile(d.pid(name), []byte(fmt.Sprintf("%d %s", pid, startTime(pid))), 0o644)
}

// launch is how a daemon was started.
type launch struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
}

func (d dirs) launchFile(name string) string { return d.pid(name) + ".launch" }

// restartable are the daemons a test may stop and start again.
var restartable = []string{"registry", "rabbitmq", "kube-apiserver", "node-a-kubelet", "node-b-kubelet", "node-a-crio", "node-b-crio", "node-a-containerd", "node-b-containerd", "node-a-containerd-2.4", "node-b-containerd-2.4"}

// stopDaemon stops one of the lab's daemons, keeping how it was started.
func (d dirs) stopDaemon(name string) error {
	if !slices.Contains(restartable, name) {
		return fmt.Errorf("%s is not one of %v", name, restartable)
	}
	if _, err := os.Stat(d.launchFile(name)); err != nil {
		return fmt.Errorf("%s was not started by this lab: %w", name, err)
	}
	return d.stop(name, 20*time.Second)
}

// startDaemon starts a stopped daemon again the way it was first started
// (one that runs is left as it is).
func (d dirs) startDaemon(name string) error {
	if !slices.Contains(restartable, name) {
		return fmt.Errorf("%s is not one of %v", name, restartable)
	}
	if _, ok := d.running(name); ok {
		return nil
	}
	b, err := os.ReadFile(d.launchFile(name))
	if err != nil {
		return fmt.Errorf("%s was not started by this lab: %w", name, err)
	}
	var l launch
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	return d.start(name, l.Argv, l.Env)
}

// startTime is a process's start time in clock ticks since boot (field 22 of
// /proc/PID/stat), or "" if there is no such process.
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name (field 2) may hold spaces; fields after it do not.
	rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
	f := strings.Fields(rest)
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// running reports the PID of a daemon the lab started, if that very process
// is alive.
func (d dirs) running(name string) (int, bool) {
	b, err := os.ReadFile(d.pid(name))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, startTime(pid) == f[1]
}

// stop ends a daemon by its recorded PID: SIGTERM, then SIGKILL after grace.
func (d dirs) stop(name string, grace time.Duration) error {
	pid, ok := d.running(name)
	_ = os.Remove(d.pid(name)) // the launch file stays, for startDaemon
	if !ok {
		return nil
	}
	t0 := time.Now()
	err := killPID(pid, grace)
	if took := time.Since(t0); took > 2*time.Second {
		logf("%s took %s to stop", name, took.Round(100*time.Millisecond))
	}
	return err
}

func killPID(pid int, grace time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil // already gone
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// waitFor polls check until it succeeds or timeout passes.
func waitFor(what string, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s: %v", what, timeout, err)
}
