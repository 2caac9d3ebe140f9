package testenv

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// CutProxy forwards loopback connections to an address until Cut, which
// closes every connection open through it, as a restore from a checkpoint
// kills the restored process's connections.
type CutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

// NewCutProxy listens on a loopback port and forwards to addr until the
// test ends.
func NewCutProxy(t testing.TB, addr string) *CutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &CutProxy{ln: ln}
	t.Cleanup(func() { _ = ln.Close(); p.Cut() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				_ = in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return p
}

// Addr is where the proxy listens.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every connection open through the proxy.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// CutProxyFor returns a CutProxy to the host of rawURL and rawURL with the
// proxy's address in its place.
func CutProxyFor(t testing.TB, rawURL string) (*CutProxy, string) {
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p := NewCutProxy(t, u.Host)
	through := *u
	through.Host = p.Addr()
	return p, through.String()
}
