// Package broker manages the RabbitMQ side of a migration: the replay queue
// that buffers every message from just before the checkpoint until the
// restored instance has caught up, and the queue depths used to estimate the
// arrival rate.
package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

// Client is a connection to the broker used by the migration manager.
type Client struct {
	mu   sync.Mutex
	conn *amqp.Connection
}

// Dial connects to the broker at url.
func Dial(url string) (*Client, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, fmt.Errorf("connect to broker %s: %w", redact(url), err)
	}
	return &Client{conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// withChannel runs fn on a fresh channel: a failed passive declare closes the
// channel it ran on, so channels are not shared between operations.
func (c *Client) withChannel(fn func(*amqp.Channel) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, err := c.conn.Channel()
	if err != nil {
		return fmt.Errorf("open broker channel: %w", err)
	}
	defer ch.Close()
	return fn(ch)
}

// CheckExchange fails unless exchange exists.
func (c *Client) CheckExchange(exchange string) error {
	return c.withChannel(func(ch *amqp.Channel) error {
		err := ch.ExchangeDeclarePassive(exchange, amqp.ExchangeFanout, true, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("exchange %q: %w", exchange, err)
		}
		return nil
	})
}

// BindReplayQueue declares queue (durable, so a broker restart does not lose
// what it buffers) and binds it to exchange.
func (c *Client) BindReplayQueue(exchange, queue string) error {
	return c.withChannel(func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare replay queue %s: %w", queue, err)
		}
		if err := ch.QueueBind(queue, "", exchange, false, nil); err != nil {
			return fmt.Errorf("bind replay queue %s to %s: %w", queue, exchange, err)
		}
		return nil
	})
}

// DeclareQueue declares a durable queue bound to nothing (it marks, by
// existing, that a migration runs).
func (c *Client) DeclareQueue(queue string) error {
	return c.withChannel(func(ch *amqp.Channel) error {
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
	return ms2m.PublishMarker(ctx, c.conn, exchange, id)
}

// QueueDepth returns the number of ready messages in queue.
func (c *Client) QueueDepth(queue string) (int, error) {
	var n int
	err := c.withChannel(func(ch *amqp.Channel) error {
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
func (c *Client) DeleteQueue(queue string) error {
	return c.withChannel(func(ch *amqp.Channel) error {
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
