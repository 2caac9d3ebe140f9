package main

import (
	"errors"
	"os"
	"strconv"
	"strings"
)

// pipeMaxSize is the largest pipe a process without CAP_SYS_RESOURCE may
// have. CRIU's page server, serving lazy pages, grows its pipes past the
// kernel's default of 1 MiB; a node's runtime has the capability, this
// machine's root does not (lab notes). The lab raises the limit while it is
// up and puts the old value back when it goes down.
const (
	pipeMaxSize     = "/proc/sys/fs/pipe-max-size"
	labPipeMaxBytes = 4 << 20
)

// raisePipeMaxSize raises the limit to labPipeMaxBytes, remembering the
// value it had in the lab's state.
func (d dirs) raisePipeMaxSize() error {
	raw, err := os.ReadFile(pipeMaxSize)
	if err != nil {
		return err
	}
	was, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || was >= labPipeMaxBytes {
		return err
	}
	if _, err := os.Stat(d.state("pipe-max-size")); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(d.state("pipe-max-size"), raw, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(pipeMaxSize, []byte(strconv.Itoa(labPipeMaxBytes)), 0o644)
}

// restorePipeMaxSize puts back the limit raisePipeMaxSize found.
func (d dirs) restorePipeMaxSize() error {
	raw, err := os.ReadFile(d.state("pipe-max-size"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.WriteFile(pipeMaxSize, raw, 0o644); err != nil {
		return err
	}
	return os.Remove(d.state("pipe-max-size"))
}
