package ms2m

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// URL is the AMQP URL of the broker.
	URL string
	// Exchange is the fanout exchange the producer publishes to.
	Exchange string
	// Queue is the primary queue, bound to Exchange.
	Queue string
	// Work is how long applying one message takes (the paper's service time).
	Work time.Duration
	// History is how many applied messages are remembered for AppliedPath.
	History int
	// Logf, if set, receives progress and reconnect messages.
	Logf func(format string, args ...any)
	// Identity returns "NAMESPACE/POD" of the pod the process runs in now
	// (default PodIdentity); tests replace it.
	Identity func() string
}

// Consumer applies sequenced messages exactly once and obeys MS2M control
// messages. Its zero value is not usable; call NewConsumer.
type Consumer struct {
	cfg ConsumerConfig

	mu      sync.Mutex
	st      State
	held    bool // a restored copy holding while its migration runs
	history []Applied
	// waiters are closed once the consume loop has acted on the latest mode.
	waiters []chan struct{}
	wake    chan struct{}
}

// NewConsumer returns a consumer that starts on the primary queue.
func NewConsumer(cfg ConsumerConfig) *Consumer {
	if cfg.History <= 0 {
		cfg.History = 20000
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Identity == nil {
		cfg.Identity = PodIdentity
	}
	now := time.Now()
	var homes []string
	if home := cfg.Identity(); home != "" {
		homes = []string{home}
	}
	return &Consumer{
		cfg: cfg,
		st: State{
			Contract:  ContractVersion,
			Homes:     homes,
			Mode:      ModePrimary,
			Queue:     cfg.Queue,
			Process:   fmt.Sprintf("%x-%x", now.UnixNano(), rand.Uint32()),
			StartedAt: now,
		},
		wake: make(chan struct{}, 1),
	}
}

// State returns a snapshot of the consumer's state.
func (c *Consumer) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// AppliedAfter returns the first remembered message applied after the one
// at p.
func (c *Consumer) AppliedAfter(p Position) (Applied, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// History is in the order of application; p is usually near its end.
	for i := len(c.history) - 1; i >= 0; i-- {
		if a := c.history[i]; a.Producer == p.Producer && a.Seq <= p.Seq {
			if i+1 == len(c.history) {
				return Applied{}, false
			}
			return c.history[i+1], true
		}
	}
	// Nothing at or before p is remembered: the first of p's run after it.
	for _, a := range c.history {
		if a.Producer == p.Producer && a.Seq > p.Seq {
			return a, true
		}
	}
	return Applied{}, false
}

// The backoff between dials the broker refuses, in a row.
const (
	firstBackoff = 100 * time.Millisecond
	maxBackoff   = 2 * time.Second
)

// Run consumes until ctx ends, reconnecting to the broker with backoff. A
// restored copy finds its connection dead and comes back through here: a
// connection that had been established is redialled at once, and the
// backoff grows only over dials that fail in a row, so what a long-lived
// process went through before its checkpoint never delays its reconnect
// after a restore.
func (c *Consumer) Run(ctx context.Context) error {
	backoff := time.Duration(0)
	for {
		connected, err := c.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if connected {
			backoff = 0
		}
		c.cfg.Logf("broker session ended: %v; reconnecting in %s", err, backoff)
		c.settle() // nothing consumes while disconnected
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(max(2*backoff, firstBackoff), maxBackoff)
		c.reconnected()
	}
}

func (c *Consumer) reconnected() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Reconnects++
	// A reconnect is also how a restored copy first notices it was moved:
	// ask where it runs now.
	if where := c.cfg.Identity(); !mayRunIn(c.st.Homes, where) && c.st.Foreign == "" {
		c.st.Foreign = where
		c.held, c.st.Mode, c.st.Queue = true, ModeHold, ""
		c.cfg.Logf("restored into pod %s, which neither this state's pods %v nor a migration named: holding, consuming nothing", where, c.st.Homes)
		return
	}
	if (c.st.PendingRestore || c.st.Mode == ModeHold) && !c.held {
		// This is (most likely) the copy restored from a checkpoint, of a
		// running source or (stop-and-copy) of a stopped one: it must not
		// compete with the source for the primary queue.
		c.held = true
		c.st.Mode = ModeHold
		c.cfg.Logf("restored from a checkpoint: holding until told to replay")
	}
}

// holdCheck paces a held copy's look for its migration.
const holdCheck = time.Second

// migrationGone reports whether no migration of this consumer runs: a held
// copy then was restored by a container restart, not by a migration.
func (c *Consumer) migrationGone(conn *amqp.Connection) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(MigrationQueueName(c.cfg.Queue), false, false, false, false, nil)
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound
}

// resumeAfterRestart puts a copy that holds with no migration running back
// on its primary queue, with the state of its checkpoint.
func (c *Consumer) resumeAfterRestart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held || c.st.Mode != ModeHold || c.st.Foreign != "" {
		return
	}
	c.held, c.st.PendingRestore = false, false
	c.st.RestoredAgain++
	c.cfg.Logf("restored from the checkpoint again with no migration running (a restart): resuming %s from sequence %d; what was applied after the checkpoint is applied again only if it is still queued", c.cfg.Queue, c.st.LastSeq)
	c.toPrimaryLocked(time.Now())
}

// session runs one broker connection; connected says whether it got one.
func (c *Consumer) session(ctx context.Context) (connected bool, err error) {
	conn, err := amqp.Dial(c.cfg.URL)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if err := DeclareTopology(conn, c.cfg.Exchange, c.cfg.Queue); err != nil {
		return true, err
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	for {
		mode, queue := c.desired()
		if mode == ModeHold {
			c.settle()
			select {
			case <-ctx.Done():
				return true, ctx.Err()
			case err := <-closed:
				return true, fmt.Errorf("connection closed: %v", err)
			case <-c.wake:
			case <-time.After(holdCheck):
				if c.isHeld() && c.migrationGone(conn) {
					c.resumeAfterRestart()
				}
			}
			continue
		}
		if err := c.consume(ctx, conn, queue, closed); err != nil {
			return true, err
		}
	}
}

// consume reads queue until the desired mode changes.
func (c *Consumer) consume(ctx context.Context, conn *amqp.Connection, queue string, closed <-chan *amqp.Error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	// Closing the channel returns any unacknowledged message to its queue.
	defer ch.Close()
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume %s: %w", queue, err)
	}
	c.settle()
	c.cfg.Logf("consuming %s", queue)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-closed:
			return fmt.Errorf("connection closed: %v", err)
		case <-c.wake:
			if mode, q := c.desired(); mode != ModeHold && q == queue {
				c.settle()
				continue
			}
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("delivery channel closed")
			}
			c.handle(ctx, d, queue)
		}
	}
}

func (c *Consumer) handle(ctx context.Context, d amqp.Delivery, queue string) {
	start := time.Now()
	var m Message
	if err := json.Unmarshal(d.Body, &m); err != nil {
		c.cfg.Logf("dropping malformed message: %v", err)
		_ = d.Reject(false)
		return
	}
	if m.Marker != "" {
		c.mu.Lock()
		c.st.Barrier = m.Marker
		c.mu.Unlock()
		_ = d.Ack(false)
		return
	}
	c.mu.Lock()
	duplicate := c.st.Reached(m.Position())
	if duplicate {
		c.st.Skipped++
	}
	c.mu.Unlock()
	if !duplicate && c.cfg.Work > 0 {
		select {
		case <-ctx.Done():
			return // unacknowledged: the broker redelivers it
		case <-time.After(c.cfg.Work):
		}
	}
	if !duplicate {
		c.apply(m, queue)
	}
	// An ack that fails (the connection died under a restore) is harmless: the
	// message comes back and is skipped as a duplicate.
	_ = d.Ack(false)
	if !duplicate {
		c.served(time.Since(start))
	}
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

func (c *Consumer) apply(m Message, queue string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.Producer != c.st.Producer {
		// A new producer run: its sequence starts again.
		if c.st.LastSeq != 0 || c.st.Producer != "" {
			retired := append(slices.Clone(c.st.RetiredProducers), c.st.Producer)
			c.st.RetiredProducers = retired[max(0, len(retired)-maxRetiredProducers):]
			c.cfg.Logf("producer run %q follows %q after its sequence %d", m.Producer, c.st.Producer, c.st.LastSeq)
		}
		c.st.Producer, c.st.LastSeq = m.Producer, 0
	}
	if c.st.LastSeq != 0 && m.Seq != c.st.LastSeq+1 {
		c.cfg.Logf("sequence gap: applied %d after %d", m.Seq, c.st.LastSeq)
	}
	c.st.Totals.Add(m)
	c.st.LastSeq = m.Seq
	c.st.LastAppliedAt = now
	if len(c.history) >= 2*c.cfg.History { // trim in halves: amortised O(1)
		c.history = append(c.history[:0], c.history[c.cfg.History:]...)
	}
	c.history = append(c.history, Applied{Producer: m.Producer, Seq: m.Seq, Sent: m.Sent, AppliedAt: now, Queue: queue})
	if c.st.Mode == ModeReplay && c.st.UntilSeq > 0 && c.st.Reached(Position{Producer: c.st.UntilProducer, Seq: c.st.UntilSeq}) {
		c.toPrimaryLocked(now)
	}
}

func (c *Consumer) toPrimaryLocked(now time.Time) {
	c.st.Mode = ModePrimary
	c.st.Queue = c.cfg.Queue
	c.st.UntilProducer, c.st.UntilSeq = "", 0
	c.st.SwitchedAt = now
	c.signalLocked()
}

func (c *Consumer) isHeld() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held
}

func (c *Consumer) desired() (Mode, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st.Mode, c.st.Queue
}

// signalLocked wakes the consume loop; c.mu must be held.
func (c *Consumer) signalLocked() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// settle releases everyone waiting for the loop to act on the current mode.
func (c *Consumer) settle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.waiters {
		close(w)
	}
	c.waiters = nil
}
