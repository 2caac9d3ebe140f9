package ms2m

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	amqp "github.com/rabbitmq/amqp091-go"
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	URL string
	// AMQP, if set, is how the connection is made (TLS, heartbeat, SASL),
	// as amqp091-go's DialConfig takes it; nil dials as amqp.Dial does.
	AMQP     *amqp.Config
	Exchange string
	// Queue, if set, is declared (with its exchange and binding) on every
	// connection, so that nothing published before its first consumer
	// started is lost.
	Queue string
	Logf  func(format string, args ...any)
}

// Publisher publishes an application's messages stamped with MS2M identity
// (HeaderProducer, HeaderSeq, HeaderSent), each confirmed by the broker.
// Each Publisher is one producer run: its ID is chosen when it is created,
// and its sequence counts from 1. It is safe for concurrent use; messages
// are published one at a time, in sequence order.
type Publisher struct {
	cfg PublisherConfig
	run string

	mu   sync.Mutex
	last uint64 // the last sequence given out
	conn *amqp.Connection
	ch   *amqp.Channel
}

// NewPublisher returns a publisher that connects on its first Publish.
func NewPublisher(cfg PublisherConfig) *Publisher {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	return &Publisher{cfg: cfg, run: fmt.Sprintf("%x-%04x", time.Now().UnixNano(), rand.Uint32()>>16)}
}

// Run is the ID of this producer run (HeaderProducer).
func (p *Publisher) Run() string { return p.run }

// Publish publishes msg to the exchange with the next sequence of this run
// and returns its position once the broker confirmed it. It retries the
// same message, with the same identity, across broker errors and reconnects
// until it is confirmed or ctx ends: a copy that did arrive earlier is
// skipped by consumers. If ctx ends first the sequence is spent all the
// same, so the next message never shares it.
func (p *Publisher) Publish(ctx context.Context, msg amqp.Publishing) (protocol.Position, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last++
	at := protocol.Position{Producer: p.run, Seq: p.last}
	msg.Headers = protocol.Stamp(cloneTable(msg.Headers), at, time.Now())
	if msg.DeliveryMode == 0 {
		msg.DeliveryMode = amqp.Persistent
	}
	backoff := firstBackoff
	for {
		err := p.publishOnce(ctx, msg)
		if err == nil {
			return at, nil
		}
		p.closeLocked()
		if ctx.Err() != nil {
			return at, fmt.Errorf("message %s not confirmed: %w", at, ctx.Err())
		}
		p.cfg.Logf("message %s not confirmed (%v); publishing it again in %s", at, err, backoff)
		select {
		case <-ctx.Done():
			return at, fmt.Errorf("message %s not confirmed: %w", at, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (p *Publisher) publishOnce(ctx context.Context, msg amqp.Publishing) error {
	if p.ch == nil {
		if err := p.connectLocked(); err != nil {
			return err
		}
	}
	conf, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, "", false, false, msg)
	if err != nil {
		return err
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("the broker refused it")
	}
	return nil
}

func (p *Publisher) connectLocked() error {
	conn, err := dial(p.cfg.URL, p.cfg.AMQP)
	if err != nil {
		return err
	}
	if p.cfg.Queue != "" {
		if err := protocol.DeclareTopology(conn, p.cfg.Exchange, p.cfg.Queue); err != nil {
			conn.Close()
			return err
		}
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return err
	}
	p.conn, p.ch = conn, ch
	return nil
}

func (p *Publisher) closeLocked() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch = nil, nil
}

// Close closes the broker connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
	return nil
}

func cloneTable(t amqp.Table) amqp.Table {
	c := make(amqp.Table, len(t)+3)
	maps.Copy(c, t)
	return c
}

// dial connects to the broker at url, with config if set.
func dial(url string, config *amqp.Config) (*amqp.Connection, error) {
	if config == nil {
		return amqp.Dial(url)
	}
	return amqp.DialConfig(url, *config)
}
