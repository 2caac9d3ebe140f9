// Command inventory is an example MS2M application with real state: a stock
// ledger that books orders from RabbitMQ into a map in memory. Its consumer
// is written against pkg/ms2m as a team would write its own: a handler, and
// a summary of its state; the library does the rest of the contract, so
// kubectl-migrate can move it between nodes with nothing lost or booked
// twice.
//
//	inventory consume --url=amqp://… --exchange=orders --queue=stock
//	inventory produce --url=amqp://… --exchange=orders --queue=stock --rate=20
//
// The producer keeps the same ledger over the orders the broker confirmed,
// so a consumer that applied exactly those reports the same digest.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "consume" && os.Args[1] != "produce") {
		fmt.Fprintln(os.Stderr, "usage: inventory consume|produce --url=AMQP_URL --exchange=NAME --queue=NAME [--rate=N]")
		os.Exit(2)
	}
	role, flags := os.Args[1], flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var url, exchange, queue string
	ms2m.BrokerFlags(flags, &url, &exchange, &queue)
	listen := flags.String("listen", ":8080", "HTTP address of the MS2M endpoints")
	rate := flags.Float64("rate", 20, "produce: orders per second")
	_ = flags.Parse(os.Args[2:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if role == "consume" {
		err = consume(ctx, *listen, url, exchange, queue)
	} else {
		err = produce(ctx, *listen, url, exchange, queue, *rate)
	}
	if err != nil {
		log.Fatal(err)
	}
}

// consume is the whole of what the application writes to be migratable.
func consume(ctx context.Context, listen, url, exchange, queue string) error {
	var inv Inventory
	c := ms2m.NewConsumer(ms2m.ConsumerConfig{
		URL: url, Exchange: exchange, Queue: queue, Logf: log.Printf,
		// Called once per order not applied yet; an error retries it.
		Handle: func(_ context.Context, d ms2m.Delivery) error {
			return inv.Apply(d.Body)
		},
		AppState: inv.Summary,
	})
	return ms2m.ServeWhile(ctx, listen, c.Handler(), c.Run)
}

// produce publishes orders at rate, each confirmed, and keeps the ledger of
// what was confirmed for checking consumers against.
func produce(ctx context.Context, listen, url, exchange, queue string, rate float64) error {
	var booked Inventory
	p := ms2m.NewProducer(ms2m.ProducerConfig{
		URL: url, Exchange: exchange, Queue: queue, Rate: rate, Logf: log.Printf,
		Body: nextOrder, ContentType: "application/json",
		Confirmed: func(_ uint64, body []byte) { _ = booked.Apply(body) },
		AppState:  booked.Summary,
	})
	return ms2m.ServeWhile(ctx, listen, p.Handler(), func(ctx context.Context) error {
		if err := p.Run(ctx); err != nil {
			return err
		}
		<-ctx.Done() // keep answering with the final ledger until told to exit
		return nil
	})
}
