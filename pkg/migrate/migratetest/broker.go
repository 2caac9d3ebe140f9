package migratetest

import (
	"context"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// The world's broker: queues and markers.

type fakeBroker World

func (f *fakeBroker) CheckExchange(context.Context, string) error { return nil }
func (f *fakeBroker) Close() error                                { return nil }

func (f *fakeBroker) BindReplayQueue(_ context.Context, _, queue string) error {
	w := (*World)(f)
	w.record("bind %s", queue)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.Queues[queue] = true
	return nil
}

func (f *fakeBroker) BindProbeQueue(_ context.Context, _, queue string, _ time.Duration) error {
	w := (*World)(f)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.Queues[queue] = true
	return nil
}

func (f *fakeBroker) DeclareQueue(_ context.Context, queue string) error {
	w := (*World)(f)
	w.record("declare %s", queue)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	w.Queues[queue] = true
	return nil
}

func (f *fakeBroker) PublishMarker(_ context.Context, _, id string) error {
	w := (*World)(f)
	w.record("marker %s", id)
	if err := w.fail(report.Prepare); err != nil {
		return err
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	for _, st := range w.Apps {
		if st.Mode == protocol.ModePrimary {
			st.Barrier = id
		}
	}
	return nil
}

func (f *fakeBroker) QueueDepth(_ context.Context, queue string) (int, error) {
	w := (*World)(f)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if !w.Queues[queue] {
		return 0, fmt.Errorf("queue %q: %w", queue, &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND"})
	}
	return 7, nil
}

func (f *fakeBroker) DeleteQueue(_ context.Context, queue string) error {
	w := (*World)(f)
	w.record("delete queue %s", queue)
	if err := w.fail(report.Cleanup); err != nil {
		return err
	}
	var held []string
	if strings.HasSuffix(queue, ".ms2m-migration") {
		held = w.runningPods(func(st *protocol.State, restored bool) bool { return restored && st.Mode == protocol.ModeHold })
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	delete(w.Queues, queue)
	// As the real consumer does: a restored copy still running when its
	// migration's queue goes takes itself for a restart and serves.
	for _, pod := range held {
		if st := w.Apps[pod]; st != nil && st.Mode == protocol.ModeHold {
			w.serve(pod, st)
		}
	}
	return nil
}
