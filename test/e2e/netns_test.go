//go:build e2e

package e2e

import (
	cryptorand "crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// inNetns runs fn on a thread moved into the lab's network namespace ns;
// the thread is discarded afterwards (its goroutine ends locked), while
// sockets fn made stay in ns.
func inNetns(ns string, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			done <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("enter %s: %w", ns, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// rawNodeCopy sends size bytes over one TCP connection from node-a's
// network to node-b's, as plainly as it gets, from memory to nowhere: the
// floor of any transfer between the nodes.
func rawNodeCopy(size int64) (time.Duration, error) {
	return nodeCopy(randomBytes(), size, io.Discard)
}

// fileNodeCopy copies a file of size bytes from node-a's disk to node-b's
// over one TCP connection, as nc would: the baseline of a direct transfer,
// which reads the archive from the source node's disk and writes it to the
// target node's. The file is written (untimed) first, so it is in the page
// cache as a checkpoint archive just written is.
func fileNodeCopy(runDir string, size int64) (time.Duration, error) {
	src, err := os.CreateTemp(filepath.Join(runDir, "node-a"), "bench-copy-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(src.Name())
	defer src.Close()
	if _, err := io.CopyN(src, randomBytes(), size); err != nil {
		return 0, err
	}
	if _, err := src.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	dst, err := os.CreateTemp(filepath.Join(runDir, "node-b"), "bench-copy-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(dst.Name())
	defer dst.Close()
	return nodeCopy(src, size, dst)
}

// nodeCopy sends size bytes of src from node-a's network to node-b's over
// one TCP connection into sink, and times it until sink has all of them.
func nodeCopy(src io.Reader, size int64, sink io.Writer) (time.Duration, error) {
	var ln net.Listener
	if err := inNetns("klab-node-b", func() (err error) {
		ln, err = net.Listen("tcp", "198.51.100.12:0")
		return err
	}); err != nil {
		return 0, err
	}
	defer ln.Close()
	received := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			received <- err
			return
		}
		defer c.Close()
		n, err := io.Copy(sink, c)
		if err == nil && n != size {
			err = fmt.Errorf("received %d of %d bytes", n, size)
		}
		received <- err
	}()
	var conn net.Conn
	if err := inNetns("klab-node-a", func() (err error) {
		conn, err = net.Dial("tcp", ln.Addr().String())
		return err
	}); err != nil {
		return 0, err
	}
	t0 := time.Now()
	_, err := io.CopyN(conn, src, size)
	conn.Close()
	if err == nil {
		err = <-received
	}
	return time.Since(t0), err
}

// randomBytes reads one random MiB over and over: incompressible bytes
// without the cost of generating them all.
func randomBytes() io.Reader {
	chunk := make([]byte, 1<<20)
	_, _ = cryptorand.Read(chunk)
	return &repeated{chunk: chunk}
}

// repeated reads chunk over and over.
type repeated struct {
	chunk []byte
	off   int
}

func (r *repeated) Read(p []byte) (int, error) {
	n := copy(p, r.chunk[r.off:])
	r.off = (r.off + n) % len(r.chunk)
	return n, nil
}
