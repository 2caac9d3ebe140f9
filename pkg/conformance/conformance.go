// Package conformance checks that an application keeps the MS2M contract
// (docs/contract.md) before it is trusted with a migration: it drives a
// running instance through its HTTP endpoint and a scratch topology on the
// broker, clause by clause, in any language the application is written in.
package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// App is the instance under test, reached over its contract endpoint.
type App interface {
	State(ctx context.Context) (protocol.State, error)
	Control(ctx context.Context, msg protocol.Control) (protocol.State, error)
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
	sent protocol.Totals
	last protocol.Position
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
func (r *run) waitFor(ctx context.Context, what string, done func(protocol.State) bool) (protocol.State, error) {
	var st protocol.State
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
func (r *run) caughtUp(ctx context.Context) (protocol.State, error) {
	st, err := r.waitFor(ctx, "applying every message sent", func(st protocol.State) bool { return st.Reached(r.last) })
	if err != nil {
		return st, err
	}
	if !st.Totals.Equal(r.sent) {
		return st, fmt.Errorf("applied %d messages (digest %s), sent %d (digest %s): lost or applied twice", st.Totals.Count, st.Totals.Digest, r.sent.Count, r.sent.Digest)
	}
	return st, nil
}

func (r *run) control(ctx context.Context, t protocol.ControlType, p protocol.ControlPayload) (protocol.State, error) {
	ctx, cancel := context.WithTimeout(ctx, r.env.Timeout)
	defer cancel()
	st, err := r.env.App.Control(ctx, protocol.Control{Type: t, Payload: p})
	if err != nil {
		return st, fmt.Errorf("%s: %w", t, err)
	}
	return st, nil
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
	for _, q := range []string{queue, protocol.ParkQueueName(queue), protocol.ReplayQueueName(queue), protocol.MigrationQueueName(queue)} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	return ch.ExchangeDelete(exchange, false, false)
}

// cleanup removes the scratch queues the check made.
func (r *run) cleanup() {
	_ = r.onChannel(func(ch *amqp.Channel) error {
		for _, q := range []string{protocol.ReplayQueueName(r.env.Queue), protocol.MigrationQueueName(r.env.Queue)} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return err
			}
		}
		return nil
	})
}
