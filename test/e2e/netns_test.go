//go:build e2e

package e2e

import (
	cryptorand "crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
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
// network to node-b's, as plainly as it gets: the baseline of a direct
// transfer.
func rawNodeCopy(size int64) (time.Duration, error) {
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
		n, err := io.Copy(io.Discard, c)
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
	chunk := make([]byte, 1<<20)
	_, _ = cryptorand.Read(chunk)
	t0 := time.Now()
	_, err := io.CopyN(conn, &repeated{chunk: chunk}, size)
	conn.Close()
	if err == nil {
		err = <-received
	}
	return time.Since(t0), err
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
