// Command ms2m-producer is the sample producer of the MS2M evaluation: it
// publishes sequenced messages at --rate per second with publisher confirms
// and reports the totals of what the broker accepted, so a consumer's final
// state can be checked against it.
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

func main() {
	var cfg ms2m.ProducerConfig
	flag.StringVar(&cfg.URL, "url", envOr("MS2M_BROKER_URL", "amqp://guest:guest@localhost:5672/"), "AMQP URL of the broker")
	flag.StringVar(&cfg.Exchange, "exchange", envOr("MS2M_EXCHANGE", "ms2m"), "fanout exchange to publish to")
	flag.StringVar(&cfg.Queue, "queue", envOr("MS2M_QUEUE", "ms2m.work"), "consumers' primary queue (declared and bound)")
	flag.Float64Var(&cfg.Rate, "rate", 10, "messages per second")
	flag.Uint64Var(&cfg.Count, "count", 0, "stop after this many messages (0: run until stopped)")
	listen := flag.String("listen", ":8080", "HTTP address of the state endpoint")
	flag.Parse()
	cfg.Logf = log.Printf

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p := ms2m.NewProducer(cfg)
	srv := &http.Server{Addr: *listen, Handler: p.Handler()}
	go func() {
		if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
			log.Fatal(err)
		}
	}()
	if err := p.Run(ctx); err != nil {
		log.Fatal(err)
	}
	// Keep serving the final totals until told to exit.
	<-ctx.Done()
	_ = srv.Shutdown(context.Background())
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
