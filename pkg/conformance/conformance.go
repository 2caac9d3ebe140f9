// Package conformance checks that an application keeps the MS2M contract
// (docs/contract.md) before it is trusted with a migration: it drives a
// running instance through its HTTP endpoint and a scratch topology on the
// broker, clause by clause, in any language the application is written in.
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

// App is the instance under test, reached over its contract endpoint.
type App interface {
	State(ctx context.Context) (ms2m.State, error)
	Control(ctx context.Context, msg ms2m.Control) (ms2m.State, error)
	// WithToken is the same instance, called with token instead of its own.
	WithToken(token string) App
}

// Env is what the check drives.
type Env struct {
	App App
	// URL reaches the broker the application consumes from; Exchange and
	// Queue are the scratch topology it was told to use (no one else's
	// messages must flow there).
	URL, Exchange, Queue string
	// Cut, if set, kills the application's broker connection as a restore
	// does (e.g. a proxy between it and the broker); the clauses that need
	// it are skipped without.
	Cut func()
	// Body is what every message the check publishes carries (default
	// {"value":1}): one the application applies; ContentType goes with it.
	Body        []byte
	ContentType string
	// Migrate, if set, migrates the instance by checkpoint and restore while
	// the check publishes, and returns the restored instance; the last
	// clause is skipped without.
	Migrate func(ctx context.Context) (App, error)
	// Timeout bounds each wait (default 20s).
	Timeout time.Duration
}

// Result is one clause's outcome.
type Result struct {
	Clause string // what was checked
	Spec   string // what docs/contract.md says
	Err    error  // nil: kept
	Skip   string // why it was not checked, if it was not
}

// Clause is one rule of the contract and how it is checked. Clauses run in
// order, on one instance: each leaves it consuming its primary queue.
type clause struct {
	name, spec string
	needsCut   bool
	check      func(*run, context.Context) error
}

var clauses = []clause{
	{"speaks contract 4", "the state reports the contract version the application implements (\"contract\")", false, (*run).version},
	{"asks for the control token", "every /ms2m/ call without the namespace's control token (header Ms2m-Token) is refused and changes nothing", false, (*run).asksForToken},
	{"applies each message once", "messages identified by ms2m-producer/ms2m-seq headers are applied once each, the totals count and digest them", false, (*run).appliesOnce},
	{"skips a redelivered message", "a message at or before the last applied position of its run is acknowledged, not applied", false, (*run).skipsDuplicate},
	{"parks a message without identity", "a message with no ms2m-seq is published to <queue>.ms2m-parked and acknowledged, not applied, not dropped", false, (*run).parksUnidentified},
	{"STOP leaves nothing consumed", "after STOP's reply nothing is consumed and nothing is held unacknowledged", false, (*run).stopHolds},
	{"RESUME continues where it stopped", "RESUME consumes the primary queue again, from the first message not applied", false, (*run).resumes},
	{"replays up to a bound, then switches", "START_REPLAY consumes the named queue; END_REPLAY switches to the primary queue once the bound is applied; what was replayed is skipped there", false, (*run).replays},
	{"takes a restarted producer's messages", "a producer run it has not seen (ms2m-producer) starts at ms2m-seq 1 again and is applied, not skipped as already applied", false, (*run).producerRestarts},
	{"reconnects at once", "after its connection dies the application redials at once and keeps its state", true, (*run).reconnects},
	{"holds after a restore while a migration runs, resumes after", "a copy that reconnects while marked by PREPARE holds while <queue>.ms2m-migration exists, and resumes on its own once it is gone", true, (*run).holdsWhileMigrating},
	{"migrates live by checkpoint and restore", "restored on another node while messages flow, the same process goes on: nothing lost, nothing applied twice", false, (*run).migrates},
}

// Run checks every clause in order, telling each result to report as it
// comes, and returns them all. It stops at the first clause that leaves the
// instance in an unknown state.
func Run(ctx context.Context, env Env, report func(Result)) []Result {
	if env.Timeout == 0 {
		env.Timeout = 20 * time.Second
	}
	if env.Body == nil {
		env.Body, env.ContentType = []byte(`{"value":1}`), "application/json"
	}
	r := &run{env: env, pub: ms2m.NewPublisher(ms2m.PublisherConfig{URL: env.URL, Exchange: env.Exchange, Queue: env.Queue})}
	defer func() { _ = r.pub.Close() }() // the publisher of the last producer run
	defer r.cleanup()
	var results []Result
	broken := ""
	for _, c := range clauses {
		res := Result{Clause: c.name, Spec: c.spec}
		switch {
		case broken != "":
			res.Skip = "not checked after " + broken + " failed"
		case c.needsCut && env.Cut == nil:
			res.Skip = "needs a way to cut the application's broker connection (a migration below cuts it for real)"
		case c.name == "migrates live by checkpoint and restore" && env.Migrate == nil:
			res.Skip = "needs two nodes to migrate between (--from and --to)"
		default:
			res.Err = c.check(r, ctx)
			if res.Err != nil {
				broken = fmt.Sprintf("%q", c.name)
			}
		}
		results = append(results, res)
		if report != nil {
			report(res)
		}
	}
	return results
}

// Summary is the whole check in the form -o prints: every clause with its
// status ("ok", "failed" or "skipped"), as kubectl migrate check prints its links.
type Summary struct {
	Image      string   `json:"image"`
	Conformant bool     `json:"conformant"`
	Clauses    []Result `json:"clauses"`
}

// Summarise is results as a Summary of image.
func Summarise(image string, results []Result) Summary {
	return Summary{Image: image, Conformant: !Failed(results), Clauses: results}
}

// MarshalJSON writes a clause with its status in words and its error as text.
func (r Result) MarshalJSON() ([]byte, error) {
	out := struct {
		Clause string `json:"clause"`
		Status string `json:"status"`
		Detail string `json:"detail,omitempty"`
		Spec   string `json:"spec"`
	}{Clause: r.Clause, Status: "ok", Spec: r.Spec}
	switch {
	case r.Err != nil:
		out.Status, out.Detail = "failed", r.Err.Error()
	case r.Skip != "":
		out.Status, out.Detail = "skipped", r.Skip
	}
	return json.Marshal(out)
}

// Failed reports whether any clause failed.
func Failed(results []Result) bool {
	for _, r := range results {
		if r.Err != nil {
			return true
		}
	}
	return false
}

type run struct {
	env  Env
	pub  *ms2m.Publisher
	sent ms2m.Totals
	last ms2m.Position
}

func (r *run) publish(ctx context.Context, n int) error {
	for range n {
		at, err := r.pub.Publish(ctx, amqp.Publishing{ContentType: r.env.ContentType, Body: r.env.Body})
		if err != nil {
			return err
		}
		r.sent.Add(at)
		r.last = at
	}
	return nil
}

// onChannel runs fn on a channel of a connection of its own.
func (r *run) onChannel(fn func(*amqp.Channel) error) error {
	conn, err := amqp.Dial(r.env.URL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return fn(ch)
}

// waitFor polls the application's state until done holds.
func (r *run) waitFor(ctx context.Context, what string, done func(ms2m.State) bool) (ms2m.State, error) {
	var st ms2m.State
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, r.env.Timeout, true, func(ctx context.Context) (bool, error) {
		st, last = r.env.App.State(ctx)
		return last == nil && done(st), nil
	})
	if err != nil {
		if last != nil {
			return st, fmt.Errorf("%s: its state cannot be read: %w", what, last)
		}
		return st, fmt.Errorf("%s: not within %s (mode %s, at %s, totals %+v, skipped %d, parked %d)", what, r.env.Timeout, st.Mode, st.Position(), st.Totals, st.Skipped, st.Parked)
	}
	return st, nil
}

// caughtUp waits for every message sent to be applied and checks totals.
func (r *run) caughtUp(ctx context.Context) (ms2m.State, error) {
	st, err := r.waitFor(ctx, "applying every message sent", func(st ms2m.State) bool { return st.Reached(r.last) })
	if err != nil {
		return st, err
	}
	if !st.Totals.Equal(r.sent) {
		return st, fmt.Errorf("applied %d messages (digest %s), sent %d (digest %s): lost or applied twice", st.Totals.Count, st.Totals.Digest, r.sent.Count, r.sent.Digest)
	}
	return st, nil
}

func (r *run) control(ctx context.Context, t ms2m.ControlType, p ms2m.ControlPayload) (ms2m.State, error) {
	ctx, cancel := context.WithTimeout(ctx, r.env.Timeout)
	defer cancel()
	st, err := r.env.App.Control(ctx, ms2m.Control{Type: t, Payload: p})
	if err != nil {
		return st, fmt.Errorf("%s: %w", t, err)
	}
	return st, nil
}

func (r *run) version(ctx context.Context) error {
	st, err := r.env.App.State(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("no state at %s: %w", ms2m.StatePath, err)
	case st.Contract != ms2m.ContractVersion:
		return fmt.Errorf("reports contract %d; this check is of contract %d", st.Contract, ms2m.ContractVersion)
	case st.Mode != ms2m.ModePrimary:
		return fmt.Errorf("a new instance is in mode %q, not %q", st.Mode, ms2m.ModePrimary)
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
			return fmt.Errorf("answered GET %s %s", ms2m.StatePath, who)
		}
		if _, err := app.Control(ctx, ms2m.Control{Type: ms2m.Stop}); err == nil {
			return fmt.Errorf("took STOP %s", who)
		}
	}
	after, err := r.env.App.State(ctx)
	if err != nil {
		return err
	}
	if after.Mode != ms2m.ModePrimary || after.PendingRestore != before.PendingRestore {
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
	again := ms2m.Position{Producer: r.last.Producer, Seq: r.last.Seq - 3}
	if err := r.onChannel(func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, r.env.Exchange, "", false, false, amqp.Publishing{
			Headers: ms2m.Stamp(nil, again, time.Now()), ContentType: r.env.ContentType, Body: r.env.Body})
	}); err != nil {
		return err
	}
	if _, err := r.waitFor(ctx, "skipping the copy of message "+again.String(), func(st ms2m.State) bool { return st.Skipped > before.Skipped }); err != nil {
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
	if _, err := r.waitFor(ctx, "counting it as parked", func(st ms2m.State) bool { return st.Parked > before.Parked }); err != nil {
		return err
	}
	return r.onChannel(func(ch *amqp.Channel) error {
		for {
			d, ok, err := ch.Get(ms2m.ParkQueueName(r.env.Queue), true)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("the message is not on %s", ms2m.ParkQueueName(r.env.Queue))
			}
			if string(d.Body) == string(body) {
				if why, _ := d.Headers[ms2m.HeaderParked].(string); why == "" {
					return fmt.Errorf("the parked message has no %s reason", ms2m.HeaderParked)
				}
				return nil
			}
		}
	})
}

func (r *run) stopHolds(ctx context.Context) error {
	stopped, err := r.control(ctx, ms2m.Stop, ms2m.ControlPayload{})
	if err != nil {
		return err
	}
	if stopped.Mode != ms2m.ModeHold {
		return fmt.Errorf("mode %q after STOP, want %q", stopped.Mode, ms2m.ModeHold)
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
	if _, err := r.control(ctx, ms2m.Resume, ms2m.ControlPayload{}); err != nil {
		return err
	}
	_, err := r.caughtUp(ctx)
	return err
}

func (r *run) replays(ctx context.Context) error {
	replay := ms2m.ReplayQueueName(r.env.Queue)
	if err := r.onChannel(func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(replay, true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(replay, "", r.env.Exchange, false, nil)
	}); err != nil {
		return err
	}
	if _, err := r.control(ctx, ms2m.Stop, ms2m.ControlPayload{}); err != nil {
		return err
	}
	// Ten messages reach both queues; the instance takes them from the
	// replay queue, then finds them again on the primary one.
	if err := r.publish(ctx, 10); err != nil {
		return err
	}
	before, err := r.control(ctx, ms2m.StartReplay, ms2m.ControlPayload{Queue: replay})
	if err != nil {
		return err
	}
	if before.Mode != ms2m.ModeReplay {
		return fmt.Errorf("mode %q after START_REPLAY, want %q", before.Mode, ms2m.ModeReplay)
	}
	if _, err := r.control(ctx, ms2m.EndReplay, ms2m.EndReplayAt(r.last).Payload); err != nil {
		return err
	}
	st, err := r.waitFor(ctx, "switching to the primary queue after the bound", func(st ms2m.State) bool {
		return st.Mode == ms2m.ModePrimary && st.Reached(r.last)
	})
	if err != nil {
		return err
	}
	if st.Queue != r.env.Queue {
		return fmt.Errorf("consumes %q after the replay, want the primary queue %q", st.Queue, r.env.Queue)
	}
	if _, err := r.waitFor(ctx, "skipping the replayed messages on the primary queue", func(s ms2m.State) bool { return s.Skipped >= before.Skipped+10 }); err != nil {
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
	if _, err := r.waitFor(ctx, "reconnecting", func(st ms2m.State) bool { return st.Reconnects > before.Reconnects }); err != nil {
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
	migration := ms2m.MigrationQueueName(r.env.Queue)
	if err := r.onChannel(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(migration, true, false, false, false, nil)
		return err
	}); err != nil {
		return err
	}
	before, err := r.control(ctx, ms2m.Prepare, ms2m.ControlPayload{Migration: "conformance"})
	if err != nil {
		return err
	}
	r.env.Cut() // as the restore of the checkpoint PREPARE marked
	held, err := r.waitFor(ctx, "holding after the reconnect", func(st ms2m.State) bool {
		return st.Reconnects > before.Reconnects && st.Mode == ms2m.ModeHold
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
		if err == nil && (st.Mode != ms2m.ModeHold || st.Position() != held.Position()) {
			return false, fmt.Errorf("consumed while a migration runs: mode %s, at %s", st.Mode, st.Position())
		}
		return false, nil
	}); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if err := r.onChannel(func(ch *amqp.Channel) error { _, err := ch.QueueDelete(migration, false, false, false); return err }); err != nil {
		return err
	}
	if _, err := r.waitFor(ctx, "resuming once no migration runs", func(st ms2m.State) bool {
		return st.Mode == ms2m.ModePrimary && st.RestoredAgain > before.RestoredAgain
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

// deleteTopology removes a scratch exchange and every queue of its
// primary queue.
func deleteTopology(url, exchange, queue string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, q := range []string{queue, ms2m.ParkQueueName(queue), ms2m.ReplayQueueName(queue), ms2m.MigrationQueueName(queue)} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	return ch.ExchangeDelete(exchange, false, false)
}

// cleanup removes the scratch queues the check made.
func (r *run) cleanup() {
	_ = r.onChannel(func(ch *amqp.Channel) error {
		for _, q := range []string{ms2m.ReplayQueueName(r.env.Queue), ms2m.MigrationQueueName(r.env.Queue)} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return err
			}
		}
		return nil
	})
}
