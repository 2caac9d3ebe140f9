package broker

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/test/testenv"
)

func TestReplayQueueLifecycle(t *testing.T) {
	ctx := context.Background()
	url := testenv.AMQPURL(t)
	exchange, primary := testenv.Name("ex"), testenv.Name("q")
	setup, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	if err := protocol.DeclareTopology(setup, exchange, primary); err != nil {
		t.Fatal(err)
	}
	c, err := Dial(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Cleanup(func() { _ = c.DeleteQueue(ctx, primary) })

	if err := c.CheckExchange(ctx, exchange); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckExchange(ctx, "no-such-exchange"); err == nil {
		t.Fatal("missing exchange accepted")
	}
	replay := protocol.ReplayQueueName(primary)
	if _, err := c.QueueDepth(ctx, replay); !IsNotFound(err) {
		t.Fatalf("replay queue before bind: %v", err)
	}
	if err := c.BindReplayQueue(ctx, exchange, replay); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := c.PublishMarker(context.Background(), exchange, "m"); err != nil {
			t.Fatal(err)
		}
	}
	// Fanout: every message reaches both queues.
	for _, q := range []string{primary, replay} {
		if n, err := c.QueueDepth(ctx, q); err != nil || n != 3 {
			t.Fatalf("%s depth %d (%v), want 3", q, n, err)
		}
	}
	if err := c.DeleteQueue(ctx, replay); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteQueue(ctx, replay); err != nil {
		t.Fatalf("deleting a gone queue must not fail: %v", err)
	}
	if _, err := c.QueueDepth(ctx, replay); !IsNotFound(err) {
		t.Fatalf("replay queue after delete: %v", err)
	}
}

func TestDialRedactsPassword(t *testing.T) {
	_, err := Dial(context.Background(), "amqp://user:s3cret@127.0.0.1:1/")
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("got %v", err)
	}
}

// TestRedialsAndHonoursContext: a connection that died (a broker restart)
// is dialled again by the next call, and a call ends with its context.
func TestRedialsAndHonoursContext(t *testing.T) {
	ctx := context.Background()
	url := testenv.AMQPURL(t)
	queue := testenv.Name("q")
	c, err := Dial(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Cleanup(func() { _ = c.DeleteQueue(ctx, queue) })
	if err := c.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	_ = c.conn.Close() // as a broker restart would
	if n, err := c.QueueDepth(ctx, queue); err != nil || n != 0 {
		t.Fatalf("after the connection died: depth %d, %v", n, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.QueueDepth(cancelled, queue); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled call: %v", err)
	}
}

// TestDialGivesUpOnASilentPeer: a peer that accepts the TCP connection but
// never speaks AMQP (a wrong port, a stuck proxy) fails the dial within its
// timeout instead of hanging it.
func TestDialGivesUpOnASilentPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	defer func() {
		select {
		case c := <-accepted:
			_ = c.Close()
		default:
		}
	}()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c // accepted, never answered
		}
	}()
	defer func(d time.Duration) { dialTimeout = d }(dialTimeout)
	dialTimeout = 300 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		_, err := Dial(context.Background(), "amqp://guest:guest@"+ln.Addr().String()+"/")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a silent peer was taken for a broker")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the dial hangs on a silent peer")
	}
}
