// Package broker manages the RabbitMQ side of a migration: the replay queue
// that buffers every message from just before the checkpoint until the
// restored instance has caught up, the queue that marks a running
// migration, and the queue depths used to estimate the arrival rate.
package broker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// dialTimeout bounds one connection attempt, the AMQP handshake included.
var dialTimeout = 15 * time.Second

// Client is a connection to the broker used by the migration manager. It
// dials again when the connection died (a broker restart), and every call
// ends when its context does.
type Client struct {
	url string

	mu   sync.Mutex
	conn *amqp.Connection
}

// localFileParams are the AMQP URI parameters that make the client read
// files of its own machine (amqp091-go loads them as TLS material).
var localFileParams = []string{"certfile", "keyfile", "cacertfile"}

// CheckAnnotatedURL refuses a broker URL taken from an annotation (which
// anyone who may edit the pod wrote) that names files on this machine: the
// client would load the operator's TLS key and certificates for a broker of
// that writer's choosing.
func CheckAnnotatedURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return nil // the dial says what is wrong with it
	}
	var named []string
	for _, p := range localFileParams {
		if u.Query().Has(p) {
			named = append(named, p)
		}
	}
	if len(named) > 0 {
		return fmt.Errorf("names files on this machine (%s)", strings.Join(named, ", "))
	}
	return nil
}

// Dial connects to the broker at url.
func Dial(ctx context.Context, url string) (*Client, error) {
	c := &Client{url: url}
	if _, err := c.connection(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// connection returns a live connection, dialling a new one if the last one
// died; c.mu must be held or c not yet shared.
func (c *Client) connection(ctx context.Context) (*amqp.Connection, error) {
	if c.conn != nil && !c.conn.IsClosed() {
		return c.conn, nil
	}
	conn, err := amqp.DialConfig(c.url, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{Timeout: dialTimeout}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// As amqp091's own dialer does: a peer that accepts but never
		// speaks AMQP must not hold the handshake forever (the library
		// clears the deadline once the connection is open).
		return conn, conn.SetDeadline(time.Now().Add(dialTimeout))
	}})
	if err != nil {
		return nil, fmt.Errorf("connect to broker %s: %w", redact(c.url), err)
	}
	c.conn = conn
	return conn, nil
}

// Close closes the connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil || c.conn.IsClosed() {
		return nil
	}
	return c.conn.Close()
}

// withChannel runs fn on a fresh channel: a failed passive declare closes the
// channel it ran on, so channels are not shared between operations. A
// connection found dead is dialled again once. When ctx ends, the channel is
// closed, which ends the call waiting on it.
func (c *Client) withChannel(ctx context.Context, fn func(*amqp.Channel) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		conn, err := c.connection(ctx)
		if err != nil {
			return err
		}
		ch, err := conn.Channel()
		if errors.Is(err, amqp.ErrClosed) && attempt == 0 {
			continue // died since: dial again
		}
		if err != nil {
			return fmt.Errorf("open broker channel: %w", err)
		}
		stop := context.AfterFunc(ctx, func() { _ = ch.Close() })
		err = fn(ch)
		stop()
		_ = ch.Close()
		if ctx.Err() != nil {
			return fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		if errors.Is(err, amqp.ErrClosed) && conn.IsClosed() && attempt == 0 {
			continue // the connection died under the call
		}
		return err
	}
}

// CheckExchange fails unless exchange exists.
func (c *Client) CheckExchange(ctx context.Context, exchange string) error {
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		err := ch.ExchangeDeclarePassive(exchange, amqp.ExchangeFanout, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("exchange %q: %w", exchange, err)
		}
		return nil
	})
}

// BindReplayQueue declares queue (durable, so a broker restart does not lose
// what it buffers) and binds it to exchange.
func (c *Client) BindReplayQueue(ctx context.Context, exchange, queue string) error {
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare replay queue %s: %w", queue, err)
		}
		if err := ch.QueueBind(queue, "", exchange, false, nil); err != nil {
			return fmt.Errorf("bind replay queue %s to %s: %w", queue, exchange, err)
		}
		return nil
	})
}

// BindProbeQueue declares a queue bound to exchange that counts arrivals
// while a migration plans: the broker deletes it by itself once unused for
// expires, so a process that dies while measuring leaves nothing for long.
func (c *Client) BindProbeQueue(ctx context.Context, exchange, queue string, expires time.Duration) error {
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, false, false, false, false, amqp.Table{"x-expires": expires.Milliseconds()}); err != nil {
			return fmt.Errorf("declare probe queue %s: %w", queue, err)
		}
		if err := ch.QueueBind(queue, "", exchange, false, nil); err != nil {
			return fmt.Errorf("bind probe queue %s to %s: %w", queue, exchange, err)
		}
		return nil
	})
}

// DeclareQueue declares a durable queue bound to nothing (it marks, by
// existing, that a migration runs).
func (c *Client) DeclareQueue(ctx context.Context, queue string) error {
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare queue %s: %w", queue, err)
		}
		return nil
	})
}

// PublishMarker publishes the MS2M marker for migration id to exchange (see
// ms2m.Message).
func (c *Client) PublishMarker(ctx context.Context, exchange, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, err := c.connection(ctx)
	if err != nil {
		return err
	}
	return protocol.PublishMarker(ctx, conn, exchange, id)
}

// QueueDepth returns the number of ready messages in queue.
func (c *Client) QueueDepth(ctx context.Context, queue string) (int, error) {
	var n int
	err := c.withChannel(ctx, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("queue %q: %w", queue, err)
		}
		n = q.Messages
		return nil
	})
	return n, err
}

// DeleteQueue deletes queue; a queue that is already gone is not an error.
func (c *Client) DeleteQueue(ctx context.Context, queue string) error {
	return c.withChannel(ctx, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil && !IsNotFound(err) {
			return fmt.Errorf("delete queue %s: %w", queue, err)
		}
		return nil
	})
}

// IsNotFound reports whether err is the broker's 404 (no such queue or
// exchange).
func IsNotFound(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.NotFound
}
