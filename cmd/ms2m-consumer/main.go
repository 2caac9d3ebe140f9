// Command ms2m-consumer is the sample stateful consumer of the MS2M
// evaluation: it applies messages, each taking --work, keeps the sum of
// their values in memory, and follows the MS2M contract through pkg/ms2m so
// kubectl-migrate can move it between nodes.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"hash/crc32"
	"log"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/sample"
)

// makeBallast returns n bytes written through, so they are resident and a
// checkpoint must carry them (pages never touched are not dumped); the
// content does not compress, as real state rarely does.
func makeBallast(n int64) []byte {
	b := make([]byte, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b
}

// verifyBallast recomputes the ballast's checksum every period, logging
// each check, and ends the process if it ever differs from the first:
// every page is read, so a page a move lost or garbled shows.
func verifyBallast(b []byte, period time.Duration) {
	want := crc32.ChecksumIEEE(b)
	log.Printf("ballast of %d bytes: crc32 %08x", len(b), want)
	for n := 1; ; n++ {
		time.Sleep(period)
		if got := crc32.ChecksumIEEE(b); got != want {
			log.Fatalf("ballast changed: crc32 %08x, was %08x", got, want)
		}
		log.Printf("ballast intact: crc32 %08x, check %d", want, n)
	}
}

func main() {
	var cfg ms2m.ConsumerConfig
	ms2m.BrokerFlags(flag.CommandLine, &cfg.URL, &cfg.Exchange, &cfg.Queue)
	work := flag.Duration("work", 0, "time to apply one message, e.g. 50ms")
	listen := flag.String("listen", ":8080", "HTTP address of the MS2M endpoints")
	ballast := flag.String("ballast", "", "extra resident memory the consumer holds, e.g. 64Mi: how a checkpoint's cost grows with the state")
	verify := flag.Duration("verify-ballast", 0, "recompute the ballast's checksum this often and exit if it changed: proof that a move kept every page of it")
	ledger := flag.String("ledger", "", "file to append each applied value to, as state on disk (e.g. in an emptyDir); read back into the state's ledgerSum")
	flag.Parse()
	cfg.Logf = log.Printf
	var sum sample.Sum
	if *ledger != "" {
		if err := sum.KeepLedger(*ledger); err != nil {
			log.Fatalf("--ledger: %v", err)
		}
	}
	cfg.Handle, cfg.AppState = sum.Handler(*work), sum.State
	var held []byte
	if *ballast != "" {
		size, err := resource.ParseQuantity(*ballast)
		if err != nil {
			log.Fatalf("--ballast %q: %v", *ballast, err)
		}
		held = makeBallast(size.Value())
		if *verify > 0 {
			go verifyBallast(held, *verify)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := ms2m.NewConsumer(cfg)
	if err := ms2m.ServeWhile(ctx, *listen, c.Handler(), c.Run); err != nil {
		log.Fatal(err)
	}
	runtime.KeepAlive(held) // resident for the process's life
}
