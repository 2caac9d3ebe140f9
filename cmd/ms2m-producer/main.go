// Command ms2m-producer is the sample producer of the MS2M evaluation: it
// publishes messages at --rate per second with publisher confirms and
// reports the totals and value sum of what the broker accepted, so a
// consumer's final state can be checked against it.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/sample"
)

func main() {
	var cfg ms2m.ProducerConfig
	ms2m.BrokerFlags(flag.CommandLine, &cfg.URL, &cfg.Exchange, &cfg.Queue)
	flag.Float64Var(&cfg.Rate, "rate", 10, "messages per second")
	flag.Uint64Var(&cfg.Count, "count", 0, "stop after this many messages (0: run until stopped)")
	listen := flag.String("listen", ":8080", "HTTP address of the state endpoint")
	flag.Parse()
	cfg.Logf = log.Printf
	var sum sample.Sum
	cfg.Body, cfg.ContentType, cfg.AppState = sample.Body, "application/json", sum.State
	cfg.Confirmed = func(_ uint64, body []byte) { _ = sum.Add(body) }

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := ms2m.NewProducer(cfg)
	run := func(ctx context.Context) error {
		if err := p.Run(ctx); err != nil {
			return err
		}
		<-ctx.Done() // keep serving the final totals until told to exit
		return nil
	}
	if err := ms2m.ServeWhile(ctx, *listen, p.Handler(), run); err != nil {
		log.Fatal(err)
	}
}
