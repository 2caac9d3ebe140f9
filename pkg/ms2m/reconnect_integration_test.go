package ms2m

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// cuttableProxy forwards loopback connections to addr until cut, which
// closes every connection open through it, as a restore kills a restored
// process's broker connection.
type cuttableProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCuttableProxy(t *testing.T, addr string) *cuttableProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttableProxy{ln: ln}
	t.Cleanup(func() { _ = ln.Close(); p.cut() })
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

func (p *cuttableProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// TestReconnectsAtOnceEveryTime: a consumer whose connection dies redials at
// once however often it died before (a restored copy must not carry the
// backoff of its past into its next migration's critical path).
func TestReconnectsAtOnceEveryTime(t *testing.T) {
	f := newFixture(t)
	broker, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCuttableProxy(t, broker.Host)
	through := *broker
	through.Host = proxy.ln.Addr().String()
	var mu sync.Mutex
	var ends []string
	c := NewConsumer(ConsumerConfig{URL: through.String(), Exchange: f.exchange, Queue: f.queue, Handle: sleep(0), Logf: func(format string, args ...any) {
		f.t.Logf(format, args...)
		if strings.HasPrefix(format, "broker session ended") {
			mu.Lock()
			ends = append(ends, args[len(args)-1].(time.Duration).String())
			mu.Unlock()
		}
	}})
	start(t, c.Run)
	start(t, f.producer(50, 100000).Run)
	var seq uint64
	for i := range 6 {
		// Applying again proves a live session through the proxy.
		eventually(t, 10*time.Second, "the consumer applying again", func() bool {
			st := c.State()
			return st.Reconnects == uint64(i) && st.LastSeq > seq
		})
		seq = c.State().LastSeq
		proxy.cut()
	}
	eventually(t, 10*time.Second, "the last reconnect", func() bool { return c.State().Reconnects == 6 })
	mu.Lock()
	defer mu.Unlock()
	for i, wait := range ends {
		if wait != "0s" {
			t.Fatalf("after cut %d of %d the consumer waited %s before redialling (all: %v)", i+1, len(ends), wait, ends)
		}
	}
}

// TestPublisherRetriesWithTheSameIdentity: connections cut under a
// Publisher in flight lose nothing and apply nothing twice: each message is
// published again with its identity until confirmed, and a consumer skips a
// copy that had arrived.
func TestPublisherRetriesWithTheSameIdentity(t *testing.T) {
	f := newFixture(t)
	broker, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCuttableProxy(t, broker.Host)
	through := *broker
	through.Host = proxy.ln.Addr().String()
	c := f.consumer(0)
	start(t, c.Run)
	pub := NewPublisher(PublisherConfig{URL: through.String(), Exchange: f.exchange, Queue: f.queue, Logf: t.Logf})
	defer pub.Close()
	var sent Totals
	var last Position
	for i := range 300 {
		if i%50 == 25 {
			go proxy.cut() // lands before, during or after a publish
		}
		at, err := pub.Publish(context.Background(), amqp.Publishing{Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if at.Seq != last.Seq+1 || at.Producer != pub.Run() {
			t.Fatalf("message %d published as %s after %s", i+1, at, last)
		}
		sent.Add(at)
		last = at
	}
	eventually(t, 20*time.Second, "all applied", func() bool { return c.State().Reached(last) })
	if got := c.State().Totals; !got.Equal(sent) {
		t.Fatalf("applied %+v, confirmed %+v", got, sent)
	}
}
