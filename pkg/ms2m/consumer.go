package ms2m

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Delivery is one message as the application's handler sees it: its
// identity from the headers, its body untouched.
type Delivery struct {
	ID protocol.Position
	// Sent is when the producer published it (HeaderSent); zero if unknown.
	Sent        time.Time
	Body        []byte
	ContentType string
	Headers     amqp.Table
	MessageID   string
	// Queue is where it came from: the primary queue, or the replay queue
	// while a restored copy catches up.
	Queue       string
	Redelivered bool
	// Attempt counts this process's tries at this message, from 1.
	Attempt int
}

// HandlerFunc applies one message to the application's state. It is called
// once per message the instance has not applied yet, one at a time, in queue
// order. It returns nil once the message is applied; the message is then
// acknowledged, and its identity recorded, so a redelivery or replay of it is
// never handed over again. An error (or a panic) means "not applied": the
// message goes back to its queue and is tried again, up to MaxAttempts, and
// is then parked (ParkQueueName) and skipped. ctx ends when the consumer
// stops running; a handler that returns ctx's error leaves the message
// unacknowledged for the broker to redeliver.
type HandlerFunc func(ctx context.Context, d Delivery) error

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// URL is the AMQP URL of the broker.
	URL string
	// AMQP, if set, is how the connection is made: TLS, heartbeat, SASL
	// mechanisms, client properties, as amqp091-go's DialConfig takes them.
	// Nil dials as amqp.Dial does.
	AMQP *amqp.Config
	// Exchange is the fanout exchange the producer publishes to.
	Exchange string
	// Queue is the primary queue, bound to Exchange.
	Queue string
	// Handle applies a message; required.
	Handle HandlerFunc
	// MaxAttempts bounds the tries at a message whose handler fails
	// (default 3); the last failure parks it.
	MaxAttempts int
	// RetryDelay is the pause before a failed message goes back to its
	// queue, times the attempt (default 100ms): a failing dependency gets
	// time to recover, and the queue is not spun.
	RetryDelay time.Duration
	// AppState, if set, is reported as State.App: the application's own
	// account of its state (e.g. a digest of its data), which a check of a
	// migration compares beside the totals. It is called from HTTP
	// handlers, concurrently with Handle.
	AppState func() any
	// History is how many applied messages are remembered for AppliedPath.
	History int
	// Logf, if set, receives progress and reconnect messages.
	Logf func(format string, args ...any)
	// Identity returns "NAMESPACE/POD" of the pod the process runs in now
	// (default PodIdentity); tests replace it.
	Identity func() string
	// TokenFile is where the pod mounts its control token (default
	// TokenFile()): read at start to authenticate control calls, and again
	// after each reconnect to prove the copy still runs in its namespace.
	TokenFile string
}

// Consumer applies sequenced messages exactly once and obeys MS2M control
// messages. Its zero value is not usable; call NewConsumer.
type Consumer struct {
	cfg ConsumerConfig
	// token is the control token read at start, kept in memory (a restored
	// copy keeps its source's); tokenErr says why there is none.
	token    []byte
	tokenErr error

	mu      sync.Mutex
	st      protocol.State
	held    bool // a restored copy holding while its migration runs
	history []protocol.Applied
	// failed counts this process's failed tries at the message in hand: one
	// at a time (prefetch 1), so one entry is enough.
	failed struct {
		at    protocol.Position
		times int
	}
	// waiters are closed once the consume loop has acted on the latest mode.
	waiters []chan struct{}
	wake    chan struct{}
}

// NewConsumer returns a consumer that starts on the primary queue.
func NewConsumer(cfg ConsumerConfig) *Consumer {
	if cfg.History <= 0 {
		cfg.History = 20000
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.RetryDelay <= 0 {
		cfg.RetryDelay = 100 * time.Millisecond
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Identity == nil {
		cfg.Identity = PodIdentity
	}
	if cfg.TokenFile == "" {
		cfg.TokenFile = TokenFile()
	}
	token, tokenErr := ReadToken(cfg.TokenFile)
	now := time.Now()
	var homes []string
	if home := cfg.Identity(); home != "" {
		homes = []string{home}
	}
	return &Consumer{
		cfg:   cfg,
		token: token, tokenErr: tokenErr,
		st: protocol.State{
			Contract:  protocol.ContractVersion,
			Homes:     homes,
			Mode:      protocol.ModePrimary,
			Queue:     cfg.Queue,
			Process:   fmt.Sprintf("%x-%x", now.UnixNano(), rand.Uint32()),
			StartedAt: now,
		},
		wake: make(chan struct{}, 1),
	}
}

// State returns a snapshot of the consumer's state, with the
// application's own (AppState).
func (c *Consumer) State() protocol.State {
	c.mu.Lock()
	st := c.st
	c.mu.Unlock()
	st.App = appJSON(c.cfg.AppState)
	return st
}

// appJSON is an application's own account of its state as JSON (nil
// without one); an account that cannot be encoded says why.
func appJSON(state func() any) json.RawMessage {
	if state == nil {
		return nil
	}
	b, err := json.Marshal(state())
	if err != nil {
		b, _ = json.Marshal(map[string]string{"error": err.Error()})
	}
	return b
}

// AppliedAfter returns the first remembered message applied after the one
// at p.
func (c *Consumer) AppliedAfter(p protocol.Position) (protocol.Applied, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// History is in the order of application; p is usually near its end.
	for i := len(c.history) - 1; i >= 0; i-- {
		if a := c.history[i]; a.Producer == p.Producer && a.Seq <= p.Seq {
			if i+1 == len(c.history) {
				return protocol.Applied{}, false
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
	return protocol.Applied{}, false
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
	if c.cfg.Handle == nil {
		return errors.New("ms2m: ConsumerConfig.Handle is required")
	}
	if c.tokenErr != nil {
		// Without a token anyone on the pod network could steer it.
		return c.tokenErr
	}
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
	if c.st.Foreign == "" {
		where := c.cfg.Identity()
		why := ""
		switch {
		case !mayRunIn(c.st.Homes, where):
			why = fmt.Sprintf("which neither this state's pods %v nor a migration named", c.st.Homes)
		case !c.tokenStillMounted():
			// Its name and namespace file are the pod's to choose; the
			// token only its namespace's pods mount.
			why = "which does not mount this state's control token (a pod of another namespace)"
		}
		if why != "" {
			c.st.Foreign = cmp.Or(where, "(unknown)")
			c.held, c.st.Mode, c.st.Queue = true, protocol.ModeHold, ""
			c.cfg.Logf("restored into pod %s, %s: holding, consuming nothing", c.st.Foreign, why)
			return
		}
	}
	if (c.st.PendingRestore || c.st.Mode == protocol.ModeHold) && !c.held {
		// This is (most likely) the copy restored from a checkpoint, of a
		// running source or (stop-and-copy) of a stopped one: it must not
		// compete with the source for the primary queue.
		c.held = true
		c.st.Mode = protocol.ModeHold
		c.cfg.Logf("restored from a checkpoint: holding until told to replay")
	}
}

// tokenStillMounted reports whether the pod the process runs in now mounts
// the control token it started with.
func (c *Consumer) tokenStillMounted() bool {
	now, err := ReadToken(c.cfg.TokenFile)
	return err == nil && tokenMatches(c.token, string(now))
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
	_, err = ch.QueueDeclarePassive(protocol.MigrationQueueName(c.cfg.Queue), false, false, false, false, nil)
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound
}

// resumeAfterRestart puts a copy that holds with no migration running back
// on its primary queue, with the state of its checkpoint.
func (c *Consumer) resumeAfterRestart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.held || c.st.Mode != protocol.ModeHold || c.st.Foreign != "" {
		return
	}
	c.held, c.st.PendingRestore = false, false
	c.st.RestoredAgain++
	c.cfg.Logf("restored from the checkpoint again with no migration running (a restart): resuming %s from sequence %d; what was applied after the checkpoint is applied again only if it is still queued", c.cfg.Queue, c.st.LastSeq)
	c.toPrimaryLocked(time.Now())
}

// session runs one broker connection; connected says whether it got one.
func (c *Consumer) session(ctx context.Context) (connected bool, err error) {
	conn, err := dial(c.cfg.URL, c.cfg.AMQP)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if err := protocol.DeclareTopology(conn, c.cfg.Exchange, c.cfg.Queue); err != nil {
		return true, err
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	for {
		mode, queue := c.desired()
		if mode == protocol.ModeHold {
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
	if err := ch.Confirm(false); err != nil { // for parking: see park
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
			if mode, q := c.desired(); mode != protocol.ModeHold && q == queue {
				c.settle()
				continue
			}
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("delivery channel closed")
			}
			c.handle(ctx, ch, d, queue)
		}
	}
}

func (c *Consumer) toPrimaryLocked(now time.Time) {
	c.st.Mode = protocol.ModePrimary
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

func (c *Consumer) desired() (protocol.Mode, string) {
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
