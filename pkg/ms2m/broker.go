package ms2m

import (
	"fmt"

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
