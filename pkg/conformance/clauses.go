package conformance

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// The contract's clauses, each a check of the running image under test.

func (r *run) version(ctx context.Context) error {
	st, err := r.env.App.State(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("no state at %s: %w", protocol.StatePath, err)
	case st.Contract != protocol.ContractVersion:
		return fmt.Errorf("reports contract %d; this check is of contract %d", st.Contract, protocol.ContractVersion)
	case st.Mode != protocol.ModePrimary:
		return fmt.Errorf("a new instance is in mode %q, not %q", st.Mode, protocol.ModePrimary)
	}
	return nil
}

func (r *run) asksForToken(ctx context.Context) error {
	before, err := r.env.App.State(ctx)
	if err != nil {
		return err
	}
	for _, token := range []string{"", "not-the-token"} {
		who := fmt.Sprintf("with token %q", token)
		if token == "" {
			who = "without a token"
		}
		app := r.env.App.WithToken(token)
		if _, err := app.State(ctx); err == nil {
			return fmt.Errorf("answered GET %s %s", protocol.StatePath, who)
		}
		if _, err := app.Control(ctx, protocol.Control{Type: protocol.Stop}); err == nil {
			return fmt.Errorf("took STOP %s", who)
		}
	}
	after, err := r.env.App.State(ctx)
	if err != nil {
		return err
	}
	if after.Mode != protocol.ModePrimary || after.PendingRestore != before.PendingRestore {
		return fmt.Errorf("refused calls changed it: mode %s, pendingRestore %v", after.Mode, after.PendingRestore)
	}
	return nil
}

// sendAndCatchUp publishes n messages and waits until all are applied.
func (r *run) sendAndCatchUp(ctx context.Context, n int) error {
	if err := r.publish(ctx, n); err != nil {
		return err
	}
	_, err := r.caughtUp(ctx)
	return err
}

func (r *run) appliesOnce(ctx context.Context) error { return r.sendAndCatchUp(ctx, 20) }

func (r *run) skipsDuplicate(ctx context.Context) error {
	before, err := r.env.App.State(ctx)
	if err != nil {
		return err
	}
	again := protocol.Position{Producer: r.last.Producer, Seq: r.last.Seq - 3}
	if err := r.onChannel(func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, r.env.Exchange, "", false, false, amqp.Publishing{
			Headers: protocol.Stamp(nil, again, time.Now()), ContentType: r.env.ContentType, Body: r.env.Body})
	}); err != nil {
		return err
	}
	if _, err := r.waitFor(ctx, "skipping the copy of message "+again.String(), func(st protocol.State) bool { return st.Skipped > before.Skipped }); err != nil {
		return err
	}
	_, err = r.caughtUp(ctx)
	return err
}

func (r *run) parksUnidentified(ctx context.Context) error {
	before, err := r.env.App.State(ctx)
	if err != nil {
		return err
	}
	body := []byte("no identity " + time.Now().Format(time.RFC3339Nano))
	if err := r.onChannel(func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, r.env.Exchange, "", false, false, amqp.Publishing{Body: body})
	}); err != nil {
		return err
	}
	if _, err := r.waitFor(ctx, "counting it as parked", func(st protocol.State) bool { return st.Parked > before.Parked }); err != nil {
		return err
	}
	return r.onChannel(func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(protocol.ParkQueueName(r.env.Queue), true)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("the message is not on %s", protocol.ParkQueueName(r.env.Queue))
			}
			if string(d.Body) == string(body) {
				if why, _ := d.Headers[protocol.HeaderParked].(string); why == "" {
					return fmt.Errorf("the parked message has no %s reason", protocol.HeaderParked)
				}
				return nil
			}
		}
	})
}

func (r *run) stopHolds(ctx context.Context) error {
	stopped, err := r.control(ctx, protocol.Stop, protocol.ControlPayload{})
	if err != nil {
		return err
	}
	if stopped.Mode != protocol.ModeHold {
		return fmt.Errorf("mode %q after STOP, want %q", stopped.Mode, protocol.ModeHold)
	}
	if err := r.publish(ctx, 5); err != nil {
		return err
	}
	// Ready counts exclude a message delivered and not acknowledged: all
	// five ready means the stopped instance holds none of them.
	var ready int
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Second, true, func(context.Context) (bool, error) {
		_ = r.onChannel(func(ch *amqp.Channel) error {
			q, err := ch.QueueDeclarePassive(r.env.Queue, true, false, false, false, nil)
			ready = q.Messages
			return err
		})
		return false, nil // watch the whole second
	})
	st, err := r.env.App.State(ctx)
	if err != nil {
		return err
	}
	if st.Position() != stopped.Position() || ready != 5 {
		return fmt.Errorf("after STOP it went from %s to %s, %d of the 5 messages sent since are ready in the queue", stopped.Position(), st.Position(), ready)
	}
	return nil
}

func (r *run) resumes(ctx context.Context) error {
	if _, err := r.control(ctx, protocol.Resume, protocol.ControlPayload{}); err != nil {
		return err
	}
	_, err := r.caughtUp(ctx)
	return err
}

func (r *run) replays(ctx context.Context) error {
	replay := protocol.ReplayQueueName(r.env.Queue)
	if err := r.onChannel(func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(replay, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(replay, "", r.env.Exchange, false, nil)
	}); err != nil {
		return err
	}
	if _, err := r.control(ctx, protocol.Stop, protocol.ControlPayload{}); err != nil {
		return err
	}
	// Ten messages reach both queues; the instance takes them from the
	// replay queue, then finds them again on the primary one.
	if err := r.publish(ctx, 10); err != nil {
		return err
	}
	before, err := r.control(ctx, protocol.StartReplay, protocol.ControlPayload{Queue: replay})
	if err != nil {
		return err
	}
	if before.Mode != protocol.ModeReplay {
		return fmt.Errorf("mode %q after START_REPLAY, want %q", before.Mode, protocol.ModeReplay)
	}
	if _, err := r.control(ctx, protocol.EndReplay, protocol.EndReplayAt(r.last).Payload); err != nil {
		return err
	}
	st, err := r.waitFor(ctx, "switching to the primary queue after the bound", func(st protocol.State) bool {
		return st.Mode == protocol.ModePrimary && st.Reached(r.last)
	})
	if err != nil {
		return err
	}
	if st.Queue != r.env.Queue {
		return fmt.Errorf("consumes %q after the replay, want the primary queue %q", st.Queue, r.env.Queue)
	}
	if _, err := r.waitFor(ctx, "skipping the replayed messages on the primary queue", func(s protocol.State) bool { return s.Skipped >= before.Skipped+10 }); err != nil {
		return err
	}
	if _, err := r.caughtUp(ctx); err != nil {
		return err
	}
	return r.onChannel(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(replay, false, false, false); return err })
}

func (r *run) producerRestarts(ctx context.Context) error {
	_ = r.pub.Close()
	r.pub = ms2m.NewPublisher(ms2m.PublisherConfig{URL: r.env.URL, Exchange: r.env.Exchange, Queue: r.env.Queue})
	return r.sendAndCatchUp(ctx, 5)
}

func (r *run) reconnects(ctx context.Context) error {
	before, err := r.env.App.State(ctx)
	if err != nil {
		return err
	}
	r.env.Cut()
	if _, err := r.waitFor(ctx, "reconnecting", func(st protocol.State) bool { return st.Reconnects > before.Reconnects }); err != nil {
		return err
	}
	if err := r.publish(ctx, 5); err != nil {
		return err
	}
	st, err := r.caughtUp(ctx)
	if err == nil && st.Process != before.Process {
		err = fmt.Errorf("the process changed (%s → %s): state must survive a reconnect in memory", before.Process, st.Process)
	}
	return err
}

func (r *run) holdsWhileMigrating(ctx context.Context) error {
	migration := protocol.MigrationQueueName(r.env.Queue)
	if err := r.onChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(migration, true, false, false, false, nil)
		return err
	}); err != nil {
		return err
	}
	before, err := r.control(ctx, protocol.Prepare, protocol.ControlPayload{Migration: "conformance"})
	if err != nil {
		return err
	}
	r.env.Cut() // as the restore of the checkpoint PREPARE marked
	held, err := r.waitFor(ctx, "holding after the reconnect", func(st protocol.State) bool {
		return st.Reconnects > before.Reconnects && st.Mode == protocol.ModeHold
	})
	if err != nil {
		return err
	}
	if err := r.publish(ctx, 3); err != nil {
		return err
	}
	// Three of its looks for the migration queue: still holding.
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 3*time.Second, true, func(ctx context.Context) (bool, error) {
		st, err := r.env.App.State(ctx)
		if err == nil && (st.Mode != protocol.ModeHold || st.Position() != held.Position()) {
			return false, fmt.Errorf("consumed while a migration runs: mode %s, at %s", st.Mode, st.Position())
		}
		return false, nil
	}); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if err := r.onChannel(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(migration, false, false, false); return err }); err != nil {
		return err
	}
	if _, err := r.waitFor(ctx, "resuming once no migration runs", func(st protocol.State) bool {
		return st.Mode == protocol.ModePrimary && st.RestoredAgain > before.RestoredAgain
	}); err != nil {
		return err
	}
	_, err = r.caughtUp(ctx)
	return err
}

// migrates publishes at 20 messages a second while env.Migrate moves the
// instance, then checks the restored one: the same process, every message.
func (r *run) migrates(ctx context.Context) error {
	before, err := r.env.App.State(ctx)
	if err != nil {
		return err
	}
	flowing, stop := context.WithCancel(ctx)
	published := make(chan error, 1)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-flowing.Done():
				published <- nil
				return
			case <-tick.C:
			}
			if err := r.publish(ctx, 1); err != nil {
				published <- err
				return
			}
		}
	}()
	target, err := r.env.Migrate(ctx)
	stop()
	if perr := <-published; err == nil {
		err = perr
	}
	if err != nil {
		return err
	}
	r.env.App = target
	after, err := r.caughtUp(ctx)
	if err != nil {
		return err
	}
	if after.Process != before.Process || after.Reconnects <= before.Reconnects {
		return fmt.Errorf("the target is process %s (reconnects %d), not the restored %s (reconnects %d)", after.Process, after.Reconnects, before.Process, before.Reconnects)
	}
	return nil
}
