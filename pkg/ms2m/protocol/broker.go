package protocol

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeclareTopology declares the fanout exchange, the durable primary queue
// bound to it, and the primary queue's park queue. It is idempotent, so
// producer and consumer both call it.
func DeclareTopology(conn *amqp.Connection, exchange, queue string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare exchange %s: %w", exchange, err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", queue, err)
	}
	if err := ch.QueueBind(queue, "", exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", queue, exchange, err)
	}
	if _, err := ch.QueueDeclare(ParkQueueName(queue), true, false, false, false, nil); err != nil {
		return fmt.Errorf("declare queue %s: %w", ParkQueueName(queue), err)
	}
	return nil
}

// PublishMarker publishes a marker for migration id to exchange, waiting for
// the broker's confirm.
func PublishMarker(ctx context.Context, conn *amqp.Connection, exchange, id string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		return err
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "", false, false, amqp.Publishing{
		Headers: amqp.Table{HeaderMarker: id}, DeliveryMode: amqp.Persistent, Timestamp: time.Now(),
		// The body is for people reading a queue; consumers go by the header.
		ContentType: "text/plain", Body: []byte("ms2m marker " + id),
	})
	if err != nil {
		return fmt.Errorf("publish marker: %w", err)
	}
	if ok, err := conf.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("marker not confirmed by the broker: %v", err)
	}
	return nil
}
