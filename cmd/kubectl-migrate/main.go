// Command kubectl-migrate is the kubectl plugin: kubectl migrate pod|sts|node|check|node-setup|conformance|recover|report|version|options.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
	"github.com/kubectl-migrate/kubectl-migrate/plugin"
)

func main() {
	version.SetCommandFrom(os.Args[0])
	root := plugin.NewRootOptions(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	// The first interrupt, termination or hang-up (a closed terminal)
	// cancels the command: a migration then rolls back; a second one stops
	// at once, leaving the journal for kubectl migrate recover.
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	var interrupted atomic.Bool
	go func() {
		sig := <-signals
		interrupted.Store(true)
		fmt.Fprintf(os.Stderr, "\n%s: %s\n", sig, root.InterruptNotice())
		cancel()
		<-signals
		if hint := root.RecoverHint(); hint != "" {
			fmt.Fprintln(os.Stderr, "stopped before the rollback ended:", hint)
			os.Exit(plugin.ExitRecover)
		}
		os.Exit(plugin.ExitInterrupted)
	}()
	cmd := plugin.NewRootCmdFor(root)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(plugin.ExitCodeAfter(err, interrupted.Load()))
	}
}
