package ms2m

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/test/testenv"
)

// TestReconnectsAtOnceEveryTime: a consumer whose connection dies redials at
// once however often it died before (a restored copy must not carry the
// backoff of its past into its next migration's critical path).
func TestReconnectsAtOnceEveryTime(t *testing.T) {
	f := newFixture(t)
	proxy, through := testenv.CutProxyFor(t, f.url)
	var mu sync.Mutex
	var ends []string
	c := NewConsumer(ConsumerConfig{URL: through, Exchange: f.exchange, Queue: f.queue, Handle: sleep(0), Logf: func(format string, args ...any) {
		f.t.Logf(format, args...)
		if strings.HasPrefix(format, "broker session ended") {
			mu.Lock()
			ends = append(ends, args[len(args)-1].(time.Duration).String())
			mu.Unlock()
		}
	}})
	start(t, c.Run)
	producer := f.producer(50, 100000)
	start(t, producer.Run)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("consumer %+v; producer at %d", c.State(), producer.State().LastSeq)
		}
	})
	var seq, reconnects uint64
	for range 6 {
		// Applying again proves a live session through the proxy. A cut
		// can end a session being set up as well, so it may cost more than
		// one reconnect: each counts at least once.
		// The bound is generous: CI runs this beside every other package
		// under the race detector on two CPUs, where a reconnect and the
		// next delivery have been seen to take over 10 s.
		eventually(t, 30*time.Second, "the consumer applying again", func() bool {
			st := c.State()
			return st.Reconnects >= reconnects && st.LastSeq > seq
		})
		st := c.State()
		seq, reconnects = st.LastSeq, st.Reconnects+1
		proxy.Cut()
	}
	eventually(t, 30*time.Second, "the last reconnect", func() bool { return c.State().Reconnects >= reconnects })
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
	proxy, through := testenv.CutProxyFor(t, f.url)
	c := f.consumer(0)
	start(t, c.Run)
	pub := NewPublisher(PublisherConfig{URL: through, Exchange: f.exchange, Queue: f.queue, Logf: t.Logf})
	defer pub.Close()
	var sent protocol.Totals
	var last protocol.Position
	for i := range 300 {
		if i%50 == 25 {
			go proxy.Cut() // lands before, during or after a publish
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
