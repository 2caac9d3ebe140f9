package ms2m

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	amqp "github.com/rabbitmq/amqp091-go"
)

// parked reads what the consumer set aside, without taking it.
func parked(t *testing.T, f *fixture) []amqp.Delivery {
	t.Helper()
	var got []amqp.Delivery
	onChannel(t, f, func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(protocol.ParkQueueName(f.queue), false)
			if err != nil || !ok {
				return err
			}
			got = append(got, d)
		}
	})
	return got
}

// recorder is an application's handler that keeps what it applied and fails
// or panics on the messages it is told to.
type recorder struct {
	mu      sync.Mutex
	bodies  [][]byte
	tries   map[uint64]int
	failFor map[uint64]int // seq → how many tries fail
	panicAt uint64
}

func (r *recorder) handle(_ context.Context, d Delivery) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tries == nil {
		r.tries = map[uint64]int{}
	}
	r.tries[d.ID.Seq]++
	if d.Attempt != r.tries[d.ID.Seq] {
		return errors.New("attempt count wrong") // shows in the test as a parked message
	}
	if d.ID.Seq == r.panicAt && r.tries[d.ID.Seq] == 1 {
		panic("a bug in the application")
	}
	if r.tries[d.ID.Seq] <= r.failFor[d.ID.Seq] {
		return errors.New("the database is unreachable")
	}
	r.bodies = append(r.bodies, d.Body)
	return nil
}

func (r *recorder) applied() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bodies)
}

// TestHandlerFailuresAreRetriedThenParked: a handler error or panic is "not
// applied": the message is tried again, in its place, up to MaxAttempts,
// and then parked with the reason; nothing is lost, the queue moves on, and
// totals count only what was applied.
func TestHandlerFailuresAreRetriedThenParked(t *testing.T) {
	f := newFixture(t)
	r := &recorder{failFor: map[uint64]int{3: 2, 5: 99}, panicAt: 4}
	c := NewConsumer(ConsumerConfig{URL: f.url, Exchange: f.exchange, Queue: f.queue, Logf: t.Logf,
		Handle: r.handle, MaxAttempts: 3, RetryDelay: time.Millisecond})
	start(t, c.Run)
	pub := NewPublisher(PublisherConfig{URL: f.url, Exchange: f.exchange, Queue: f.queue, Logf: t.Logf})
	defer pub.Close()
	var sent protocol.Totals
	for i := range 8 {
		at, err := pub.Publish(context.Background(), amqp.Publishing{Body: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		if at.Seq != 5 {
			sent.Add(at)
		}
	}
	eventually(t, 10*time.Second, "all 8 handled", func() bool { return c.State().LastSeq == 8 })
	st := c.State()
	if !st.Totals.Equal(sent) || st.Parked != 1 || r.applied() != 7 {
		t.Fatalf("applied %+v (%d bodies), parked %d; want the 7 messages but 5 applied, 5 parked", st.Totals, r.applied(), st.Parked)
	}
	r.mu.Lock()
	order := bytes.Join(r.bodies, nil)
	tries := r.tries
	r.mu.Unlock()
	if !bytes.Equal(order, []byte{0, 1, 2, 3, 5, 6, 7}) { // seq n carries body n-1
		t.Fatalf("applied in the order %v: a retried message must keep its place", order)
	}
	if tries[3] != 3 || tries[4] != 2 || tries[5] != 3 {
		t.Fatalf("tries %v: want 3 for a message failing twice, 2 after a panic, MaxAttempts (3) for one that always fails", tries)
	}
	p := parked(t, f)
	if len(p) != 1 || !bytes.Equal(p[0].Body, []byte{4}) || p[0].Headers[protocol.HeaderSeq] != int64(5) {
		t.Fatalf("parked %d messages; want message 5 with its body and identity", len(p))
	}
	if why, _ := p[0].Headers[protocol.HeaderParked].(string); why == "" {
		t.Fatal("a parked message says nothing of why")
	}
}

// TestOpaqueBodiesAndUnidentifiedMessages: bodies are the application's
// bytes, untouched (not JSON here); a message without identity headers is
// parked, not dropped and not applied, and a redelivered copy of an applied
// message is never handed to the handler again.
func TestOpaqueBodiesAndUnidentifiedMessages(t *testing.T) {
	f := newFixture(t)
	r := &recorder{}
	c := NewConsumer(ConsumerConfig{URL: f.url, Exchange: f.exchange, Queue: f.queue, Logf: t.Logf, Handle: r.handle})
	start(t, c.Run)
	protobufLike := []byte{0x08, 0x96, 0x01, 0x12, 0x03, 'a', 0xff, 0x00}
	run := protocol.Position{Producer: "run-1"}
	conn, err := amqp.Dial(f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := protocol.DeclareTopology(conn, f.exchange, f.queue); err != nil { // as a producer does
		t.Fatal(err)
	}
	onChannel(t, f, func(ch *amqp.Channel) error {
		pub := func(h amqp.Table, body []byte) error {
			return ch.PublishWithContext(context.Background(), f.exchange, "", false, false,
				amqp.Publishing{ContentType: "application/x-protobuf", Headers: h, Body: body})
		}
		for _, m := range []struct {
			h    amqp.Table
			body []byte
		}{
			{protocol.Stamp(nil, protocol.Position{Producer: run.Producer, Seq: 1}, time.Now()), protobufLike},
			{amqp.Table{"trace-id": "abc"}, []byte("no identity")},
			{amqp.Table{protocol.HeaderProducer: run.Producer, protocol.HeaderSeq: "2"}, []byte("seq as a string")}, // a client that can only send strings
			{protocol.Stamp(nil, protocol.Position{Producer: run.Producer, Seq: 1}, time.Now()), []byte("a redelivery of 1")},
			{amqp.Table{protocol.HeaderProducer: run.Producer, protocol.HeaderSeq: int32(3)}, []byte("seq as int32")},
		} {
			if err := pub(m.h, m.body); err != nil {
				return err
			}
		}
		return nil
	})
	eventually(t, 10*time.Second, "3 applied, 1 parked", func() bool { st := c.State(); return st.LastSeq == 3 && st.Parked == 1 })
	st := c.State()
	r.mu.Lock()
	bodies := r.bodies
	r.mu.Unlock()
	if len(bodies) != 3 || !bytes.Equal(bodies[0], protobufLike) || st.Skipped != 1 {
		t.Fatalf("applied %q, skipped %d: want the 3 identified messages once, the body untouched, the redelivery skipped", bodies, st.Skipped)
	}
	p := parked(t, f)
	if len(p) != 1 || string(p[0].Body) != "no identity" || p[0].Headers["trace-id"] != "abc" {
		t.Fatalf("parked %d messages; want the unidentified one with its headers", len(p))
	}
}
