package ms2m

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The SDK connects as amqp091-go's Config says (TLS, heartbeat, SASL, its
// dialer): the application's own settings reach the connection.
func TestTheAMQPConfigMakesTheConnection(t *testing.T) {
	var dialed []string
	config := &amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		dialed = append(dialed, addr)
		return nil, errors.New("refused by the test")
	}}
	if _, err := dial("amqp://guest:guest@broker.example:5673/", config); err == nil || !strings.Contains(err.Error(), "refused by the test") {
		t.Fatalf("dial through the config's dialer: %v", err)
	}
	// The publisher retries until its context ends, each time so.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	p := NewPublisher(PublisherConfig{URL: "amqp://guest:guest@broker.example:5673/", Exchange: "ex", AMQP: config})
	if _, err := p.Publish(ctx, amqp.Publishing{Body: []byte("x")}); err == nil {
		t.Fatal("published without a broker")
	}
	if len(dialed) < 2 || dialed[0] != "broker.example:5673" || dialed[1] != "broker.example:5673" {
		t.Fatalf("the config's dialer was asked for %v", dialed)
	}
}
