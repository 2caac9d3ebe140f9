package ms2m

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeclareTopology declares the fanout exchange and the durable primary queue
// bound to it. It is idempotent, so producer and consumer both call it.
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
	body, _ := json.Marshal(Message{Marker: id, Sent: time.Now()})
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, "", false, false,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body})
	if err != nil {
		return fmt.Errorf("publish marker: %w", err)
	}
	if ok, err := conf.WaitContext(ctx); err != nil || !ok {
		return fmt.Errorf("marker not confirmed by the broker: %v", err)
	}
	return nil
}
