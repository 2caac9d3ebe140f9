package ms2m

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	amqp "github.com/rabbitmq/amqp091-go"
)

// How a message is applied exactly once: the handler and its retries,
// parking what keeps failing, and the state each applied message moves.

func (c *Consumer) handle(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, queue string) {
	start := time.Now()
	id, err := protocol.Identify(d.Headers)
	if err != nil {
		c.park(ctx, ch, d, fmt.Sprintf("no message identity (%v): stamp messages with headers %s and %s", err, protocol.HeaderProducer, protocol.HeaderSeq))
		return
	}
	if id.Marker != "" {
		c.mu.Lock()
		c.st.Barrier = id.Marker
		c.mu.Unlock()
		_ = d.Ack(false)
		return
	}
	c.mu.Lock()
	duplicate := c.st.Reached(id.Position)
	if duplicate {
		c.st.Skipped++
	}
	attempt := 1
	if c.failed.at == id.Position {
		attempt += c.failed.times
	}
	c.mu.Unlock()
	if duplicate {
		// An ack that fails (the connection died under a restore) is
		// harmless: the message comes back and is skipped again.
		_ = d.Ack(false)
		return
	}
	err = c.callHandler(ctx, Delivery{
		ID: id.Position, Sent: id.Sent, Body: d.Body, ContentType: d.ContentType, Headers: d.Headers,
		MessageID: d.MessageId, Queue: queue, Redelivered: d.Redelivered, Attempt: attempt,
	})
	switch {
	case err == nil:
		c.apply(id, queue)
		_ = d.Ack(false)
		c.served(time.Since(start))
	case ctx.Err() != nil:
		// Shutting down: unacknowledged, the broker redelivers it.
	case attempt >= c.cfg.MaxAttempts:
		c.park(ctx, ch, d, fmt.Sprintf("handler failed %d times, last: %v", attempt, err))
		c.mu.Lock()
		c.passLocked(id.Position) // parked: a replayed copy of it is not tried again
		c.mu.Unlock()
	default:
		c.mu.Lock()
		c.failed.at, c.failed.times = id.Position, attempt
		c.mu.Unlock()
		c.cfg.Logf("message %s not applied (attempt %d of %d): %v", id.Position, attempt, c.cfg.MaxAttempts, err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(attempt) * c.cfg.RetryDelay):
		}
		_ = d.Nack(false, true) // back to its place at the head of the queue
	}
}

// callHandler runs the application's handler, turning a panic into an error
// so that one bad message does not crash the process (and loop its restart).
func (c *Consumer) callHandler(ctx context.Context, d Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return c.cfg.Handle(ctx, d)
}

// park sets a message aside, unapplied, on the park queue, and acknowledges
// it once the broker confirmed the copy: nothing is dropped, and the queue
// moves on. If the copy cannot be made the message goes back to its queue.
func (c *Consumer) park(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, reason string) {
	queue := protocol.ParkQueueName(c.cfg.Queue)
	c.cfg.Logf("parking a message on %s: %s", queue, reason)
	headers := amqp.Table{}
	maps.Copy(headers, d.Headers)
	headers[protocol.HeaderParked] = reason
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		DeliveryMode: amqp.Persistent, MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, Body: d.Body,
	})
	if err == nil {
		var ok bool
		if ok, err = conf.WaitContext(ctx); err == nil && !ok {
			err = errors.New("the broker refused it")
		}
	}
	if err != nil {
		c.cfg.Logf("could not park it (%v): returning it to its queue", err)
		_ = d.Nack(false, true)
		return
	}
	_ = d.Ack(false)
	c.mu.Lock()
	c.st.Parked++
	c.mu.Unlock()
}

// served folds one message's service time into ServiceMillis, a moving
// average over roughly the last ten messages.
func (c *Consumer) served(took time.Duration) {
	ms := float64(took) / float64(time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st.ServiceMillis == 0 {
		c.st.ServiceMillis = ms
		return
	}
	c.st.ServiceMillis += (ms - c.st.ServiceMillis) / 10
}

// apply records that the message id was applied.
func (c *Consumer) apply(id protocol.Identity, queue string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.passLocked(id.Position)
	c.st.Totals.Add(id.Position)
	c.st.LastAppliedAt = now
	if len(c.history) >= 2*c.cfg.History { // trim in halves: amortised O(1)
		c.history = append(c.history[:0], c.history[c.cfg.History:]...)
	}
	c.history = append(c.history, protocol.Applied{Producer: id.Producer, Seq: id.Seq, Sent: id.Sent, AppliedAt: now, Queue: queue})
	if c.st.Mode == protocol.ModeReplay && c.st.UntilSeq > 0 && c.st.Reached(protocol.Position{Producer: c.st.UntilProducer, Seq: c.st.UntilSeq}) {
		c.toPrimaryLocked(now)
	}
}

// passLocked moves the position past m, applied or parked: a message at or
// before it is a duplicate from now on.
func (c *Consumer) passLocked(m protocol.Position) {
	c.failed.at, c.failed.times = protocol.Position{}, 0
	if m.Producer != c.st.Producer {
		// A new producer run: its sequence starts again.
		if c.st.LastSeq != 0 || c.st.Producer != "" {
			retired := append(slices.Clone(c.st.RetiredProducers), c.st.Producer)
			c.st.RetiredProducers = retired[max(0, len(retired)-protocol.MaxRetiredProducers):]
			c.cfg.Logf("producer run %q follows %q after its sequence %d", m.Producer, c.st.Producer, c.st.LastSeq)
		}
		c.st.Producer, c.st.LastSeq = m.Producer, 0
	}
	if c.st.LastSeq != 0 && m.Seq != c.st.LastSeq+1 {
		c.cfg.Logf("sequence gap: %d after %d", m.Seq, c.st.LastSeq)
	}
	c.st.LastSeq = m.Seq
}
