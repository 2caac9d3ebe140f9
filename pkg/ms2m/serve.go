package ms2m

import (
	"context"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"time"
)

// ServeWhile serves h on addr while run runs, then shuts the server down.
// The sample binaries use it; an application may too.
func ServeWhile(ctx context.Context, addr string, h http.Handler, run func(context.Context) error) error {
	ln, err := Listen(ctx, addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	runErr := make(chan error, 1)
	go func() { runErr <- run(ctx) }()
	select {
	case err := <-serveErr:
		return err // the endpoint is part of the contract: no endpoint, no service
	case err := <-runErr:
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if sErr := srv.Shutdown(shutdown); sErr != nil && !errors.Is(sErr, http.ErrServerClosed) && err == nil {
			err = sErr
		}
		return err
	}
}

// Listen opens a TCP listener that CRIU can checkpoint. Go (≥ 1.24) makes
// listeners Multipath TCP where the kernel has it, and CRIU cannot dump MPTCP
// sockets ("inet: Unsupported proto 262"), so MPTCP is switched off here.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, "tcp", addr)
}

// BrokerFlags registers --url, --exchange and --queue on fs, defaulting to
// $MS2M_BROKER_URL, $MS2M_EXCHANGE and $MS2M_QUEUE.
func BrokerFlags(fs *flag.FlagSet, url, exchange, queue *string) {
	fs.StringVar(url, "url", EnvOr("MS2M_BROKER_URL", "amqp://guest:guest@localhost:5672/"), "AMQP URL of the broker")
	fs.StringVar(exchange, "exchange", EnvOr("MS2M_EXCHANGE", "ms2m"), "fanout exchange the producer publishes to")
	fs.StringVar(queue, "queue", EnvOr("MS2M_QUEUE", "ms2m.work"), "the consumer's primary queue (declared and bound)")
}

// EnvOr returns the environment variable key, or def if it is unset.
func EnvOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
