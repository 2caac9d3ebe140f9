// Command ms2m-consumer is the sample stateful consumer of the MS2M
// evaluation: it applies sequenced messages, each taking --work, keeps count,
// sum and digest of the applied set in memory, and follows the MS2M contract
// so kubectl-migrate can move it between nodes.
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

func main() {
	var cfg ms2m.ConsumerConfig
	ms2m.BrokerFlags(flag.CommandLine, &cfg.URL, &cfg.Exchange, &cfg.Queue)
	flag.DurationVar(&cfg.Work, "work", 0, "time to apply one message, e.g. 50ms")
	listen := flag.String("listen", ":8080", "HTTP address of the MS2M endpoints")
	flag.Parse()
	cfg.Logf = log.Printf

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := ms2m.NewConsumer(cfg)
	if err := ms2m.ServeWhile(ctx, *listen, c.Handler(), c.Run); err != nil {
		log.Fatal(err)
	}
}
