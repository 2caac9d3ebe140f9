package ms2m

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/test/testenv"
)

// restoredCopy stands in for CRIU in a unit of the protocol: a consumer
// whose memory is the source's at this moment, as a restore on another node
// would bring it back, including the reconnect a restore causes.
func restoredCopy(src *Consumer) *Consumer {
	src.mu.Lock()
	defer src.mu.Unlock()
	c := NewConsumer(src.cfg)
	c.st = src.st
	c.history = append([]protocol.Applied(nil), src.history...)
	c.reconnected()
	return c
}

type fixture struct {
	t        *testing.T
	url      string
	exchange string
	queue    string
}

func newFixture(t *testing.T) *fixture {
	f := &fixture{t: t, url: testenv.AMQPURL(t), exchange: testenv.Name("ex"), queue: testenv.Name("q")}
	t.Cleanup(func() {
		conn, err := amqp.Dial(f.url)
		if err != nil {
			return
		}
		defer conn.Close()
		ch, _ := conn.Channel()
		_, _ = ch.QueueDelete(f.queue, false, false, false)
		_, _ = ch.QueueDelete(protocol.ReplayQueueName(f.queue), false, false, false)
		_, _ = ch.QueueDelete(protocol.MigrationQueueName(f.queue), false, false, false)
		_ = ch.ExchangeDelete(f.exchange, false, false)
	})
	return f
}

// consumer counts what it applies; each message takes work.
func (f *fixture) consumer(work time.Duration) *Consumer {
	return NewConsumer(ConsumerConfig{URL: f.url, Exchange: f.exchange, Queue: f.queue, Logf: f.t.Logf, Handle: sleep(work)})
}

func sleep(work time.Duration) HandlerFunc {
	return func(ctx context.Context, _ Delivery) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(work):
			return nil
		}
	}
}

func (f *fixture) producer(rate float64, count uint64) *Producer {
	return NewProducer(ProducerConfig{URL: f.url, Exchange: f.exchange, Queue: f.queue, Rate: rate, Count: count, Logf: f.t.Logf})
}

// start runs fn until the test ends.
func start(t *testing.T, run func(context.Context) error) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return cancel
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func control(t *testing.T, c *Consumer, msg protocol.Control) protocol.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Control(ctx, msg)
	if err != nil {
		t.Fatalf("%s: %v", msg.Type, err)
	}
	return st
}

func publishMarker(t *testing.T, f *fixture, id string) {
	t.Helper()
	conn, err := amqp.Dial(f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := protocol.PublishMarker(context.Background(), conn, f.exchange, id); err != nil {
		t.Fatal(err)
	}
}

// onChannel runs fn on a channel of a connection of its own.
func onChannel(t *testing.T, f *fixture, fn func(*amqp.Channel) error) {
	t.Helper()
	conn, err := amqp.Dial(f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := fn(ch); err != nil {
		t.Fatal(err)
	}
}

// markMigrating declares the queue that says a migration runs, as the
// migration manager does first.
func markMigrating(t *testing.T, f *fixture) {
	t.Helper()
	onChannel(t, f, func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(protocol.MigrationQueueName(f.queue), true, false, false, false, nil)
		return err
	})
}

func bindReplayQueue(t *testing.T, f *fixture) {
	t.Helper()
	markMigrating(t, f)
	onChannel(t, f, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(protocol.ReplayQueueName(f.queue), true, false, false, false, nil); err != nil {
			return err
		}
		return ch.QueueBind(protocol.ReplayQueueName(f.queue), "", f.exchange, false, nil)
	})
}

// TestMigrationProtocolConservesMessages runs the MS2M protocol against a
// real broker while the producer keeps publishing: the final state must
// equal the producer's confirmed set exactly, with no loss and no duplicate.
func TestMigrationProtocolConservesMessages(t *testing.T) {
	migrateByProtocol(t, false)
}

// TestProducerRestartedDuringReplay: a producer that restarts while the
// restored copy replays starts its sequence at 1 again; neither the source
// nor the copy may take its messages for ones already applied, and the
// replay ends at the source's last message of the new run.
func TestProducerRestartedDuringReplay(t *testing.T) {
	migrateByProtocol(t, true)
}

func migrateByProtocol(t *testing.T, restartProducer bool) {
	f := newFixture(t)
	src := f.consumer(5 * time.Millisecond)
	stopSrc := start(t, src.Run)
	prod := f.producer(100, 0)
	start(t, prod.Run)
	eventually(t, 10*time.Second, "source applying", func() bool { return src.State().LastSeq >= 20 })

	bindReplayQueue(t, f)
	control(t, src, protocol.Control{Type: protocol.Prepare})
	publishMarker(t, f, "m1")
	eventually(t, 10*time.Second, "source passing the marker", func() bool { return src.State().Barrier == "m1" })
	target := restoredCopy(src) // "checkpoint"
	control(t, src, protocol.Control{Type: protocol.Checkpointed})
	if st := src.State(); st.PendingRestore || st.Mode != protocol.ModePrimary {
		t.Fatalf("source after checkpoint: %+v", st)
	}
	if st := target.State(); st.Mode != protocol.ModeHold {
		t.Fatalf("restored copy must hold, is %s", st.Mode)
	}
	if target.State().Process != src.State().Process {
		t.Fatal("a restored copy keeps the process identity")
	}
	start(t, target.Run)
	time.Sleep(200 * time.Millisecond) // the source keeps applying; the target must not
	if got := target.State().Totals.Count; got > src.State().Totals.Count {
		t.Fatal("holding copy applied messages")
	}

	control(t, target, protocol.Control{Type: protocol.StartReplay, Payload: protocol.ControlPayload{Queue: protocol.ReplayQueueName(f.queue)}})
	var earlier protocol.Totals // what producer runs before the current one confirmed
	if restartProducer {
		// Stopped, not cancelled: a message whose confirm is on its way is
		// counted then, where a cancelled producer would have delivered it
		// uncounted.
		prod.Stop()
		eventually(t, 5*time.Second, "first producer run stopped", func() bool { return prod.State().Stopped })
		earlier = prod.State().Totals
		first := prod.State().Position()
		prod = f.producer(100, 0)
		start(t, prod.Run)
		eventually(t, 10*time.Second, "the new run past the old one's last sequence", func() bool { return prod.State().LastSeq > first.Seq+20 })
		if st := src.State(); st.Producer != prod.State().Producer || st.RetiredProducers[len(st.RetiredProducers)-1] != first.Producer {
			t.Fatalf("source after the producer restarted: producer %q, retired %v; want %q after %q", st.Producer, st.RetiredProducers, prod.State().Producer, first.Producer)
		}
	}
	eventually(t, 20*time.Second, "target catching up", func() bool { return target.State().Reached(src.State().Position()) })
	final := control(t, src, protocol.Control{Type: protocol.Stop})
	stopSrc()
	control(t, target, protocol.EndReplayAt(final.Position()))
	eventually(t, 10*time.Second, "target on the primary queue", func() bool { return target.State().Mode == protocol.ModePrimary })

	time.Sleep(300 * time.Millisecond) // let live traffic flow through the target
	prod.Stop()
	eventually(t, 5*time.Second, "producer stopped", func() bool { return prod.State().Stopped })
	sent := prod.State()
	eventually(t, 20*time.Second, "target draining", func() bool { return target.State().Reached(sent.Position()) })

	got, want := target.State(), earlier.Plus(sent.Totals)
	if !got.Totals.Equal(want) {
		t.Fatalf("applied %+v, sent %+v (skipped %d)", got.Totals, want, got.Skipped)
	}
	next, ok := target.AppliedAfter(final.Position())
	if !ok || next.Seq != final.LastSeq+1 || next.Producer != final.Producer {
		t.Fatalf("first message after the source's last (%s): %+v %v", final.Position(), next, ok)
	}
}

// TestRestoredAgainResumesOnlyWithoutAMigration: a copy restored from its
// checkpoint holds while a migration runs, and takes its primary queue back
// on its own once none does (its container restarted after the migration).
func TestRestoredAgainResumesOnlyWithoutAMigration(t *testing.T) {
	f := newFixture(t)
	src := f.consumer(0)
	start(t, src.Run)
	prod := f.producer(50, 0)
	start(t, prod.Run)
	eventually(t, 10*time.Second, "source applying", func() bool { return src.State().LastSeq >= 10 })
	markMigrating(t, f)
	control(t, src, protocol.Control{Type: protocol.Prepare})
	copyDuringMigration := restoredCopy(src)
	start(t, copyDuringMigration.Run)
	// Bounded negative check: three of its looks for the migration queue.
	time.Sleep(3 * holdCheck)
	if st := copyDuringMigration.State(); st.Mode != protocol.ModeHold || st.RestoredAgain != 0 {
		t.Fatalf("a copy restored during a migration must hold: %+v", st)
	}
	control(t, copyDuringMigration, protocol.Control{Type: protocol.StartReplay, Payload: protocol.ControlPayload{Queue: f.queue}})
	control(t, copyDuringMigration, protocol.Control{Type: protocol.Stop})

	onChannel(t, f, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(protocol.MigrationQueueName(f.queue), false, false, false)
		return err
	})
	restarted := restoredCopy(src) // the runtime restores the checkpoint again
	start(t, restarted.Run)
	eventually(t, 10*holdCheck, "the restarted copy serving", func() bool {
		st := restarted.State()
		return st.Mode == protocol.ModePrimary && st.RestoredAgain == 1 && !st.PendingRestore
	})
	before := restarted.State().LastSeq
	eventually(t, 10*time.Second, "the restarted copy applying", func() bool { return restarted.State().LastSeq > before })
}

// TestStopReturnsMessagesToQueue checks that a stopped instance consumes
// nothing and that Resume continues exactly where it stopped.
func TestStopAndResume(t *testing.T) {
	f := newFixture(t)
	c := f.consumer(0)
	start(t, c.Run)
	prod := f.producer(200, 60)
	start(t, prod.Run)
	eventually(t, 10*time.Second, "consumer applying", func() bool { return c.State().LastSeq >= 10 })
	stopped := control(t, c, protocol.Control{Type: protocol.Stop})
	time.Sleep(150 * time.Millisecond)
	if c.State().LastSeq != stopped.LastSeq {
		t.Fatalf("consumed after STOP: %d → %d", stopped.LastSeq, c.State().LastSeq)
	}
	control(t, c, protocol.Control{Type: protocol.Resume})
	eventually(t, 10*time.Second, "producer done", func() bool { return prod.State().Stopped })
	eventually(t, 10*time.Second, "all 60 applied", func() bool { return c.State().LastSeq == 60 })
	if got, want := c.State().Totals, prod.State().Totals; got != want {
		t.Fatalf("applied %+v, sent %+v", got, want)
	}
}

func TestControlRejectsBadMessages(t *testing.T) {
	c := NewConsumer(ConsumerConfig{Queue: "q"})
	ctx := context.Background()
	if _, err := c.Control(ctx, protocol.Control{Type: "DANCE"}); err == nil {
		t.Fatal("unknown type accepted")
	}
	if _, err := c.Control(ctx, protocol.Control{Type: protocol.StartReplay}); err == nil {
		t.Fatal("START_REPLAY without a queue accepted")
	}
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	// Nothing runs the consume loop, so the stop cannot take effect.
	if _, err := c.Control(ctx, protocol.Control{Type: protocol.Stop}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want a deadline error, got %v", err)
	}
}

// preparedSource is a source in pod team/consumer, applying what a
// producer sends at 50/s, whose migration to team/consumer-x1 runs and has
// marked it (PREPARE).
func preparedSource(t *testing.T) (*fixture, *Consumer) {
	f := newFixture(t)
	cfg := ConsumerConfig{URL: f.url, Exchange: f.exchange, Queue: f.queue, Logf: t.Logf, Handle: sleep(0), Identity: func() string { return "team/consumer" }}
	src := NewConsumer(cfg)
	start(t, src.Run)
	prod := f.producer(50, 0)
	start(t, prod.Run)
	eventually(t, 10*time.Second, "source applying", func() bool { return src.State().LastSeq >= 10 })
	markMigrating(t, f)
	control(t, src, protocol.Control{Type: protocol.Prepare, Payload: protocol.ControlPayload{Target: "team/consumer-x1"}})
	return f, src
}

// rightfulResumes restores src in the migration's target,
// team/consumer-x1, and waits until that copy, with no migration running,
// resumes its queue on its own and applies.
func rightfulResumes(t *testing.T, src *Consumer) {
	t.Helper()
	rightful := restoredCopyIn(src, "team/consumer-x1")
	start(t, rightful.Run)
	eventually(t, 10*holdCheck, "the target's copy serving", func() bool {
		st := rightful.State()
		return st.Mode == protocol.ModePrimary && st.RestoredAgain == 1 && st.Foreign == ""
	})
	before := rightful.State().LastSeq
	eventually(t, 10*time.Second, "the target's copy applying", func() bool { return rightful.State().LastSeq > before+5 })
}

// restoredCopyIn is restoredCopy, run in the pod identity names, of the
// source's namespace (it mounts the same control token).
func restoredCopyIn(src *Consumer, identity string) *Consumer {
	return restoredCopyInPod(src, identity, src.cfg.TokenFile)
}

// restoredCopyInPod is restoredCopy, run in the pod identity names, which
// mounts tokenFile.
func restoredCopyInPod(src *Consumer, identity, tokenFile string) *Consumer {
	src.mu.Lock()
	cfg := src.cfg
	src.mu.Unlock()
	cfg.Identity = func() string { return identity }
	cfg.TokenFile = tokenFile
	c := NewConsumer(cfg)
	// The token is in the memory the copy was restored with.
	c.token, c.tokenErr = src.token, src.tokenErr
	src.mu.Lock()
	c.st = src.st
	c.history = append([]protocol.Applied(nil), src.history...)
	src.mu.Unlock()
	c.reconnected()
	return c
}

// TestCopyInAPodNoMigrationNamedNeverConsumes: a checkpoint of a migrated
// source restored by a pod of another namespace (which only has to name the
// image) holds for good, even once no migration runs, and refuses to
// consume when told to; the migration's own target resumes.
func TestCopyInAPodNoMigrationNamedNeverConsumes(t *testing.T) {
	f, src := preparedSource(t)

	foreign := restoredCopyIn(src, "attacker/consumer-x1")
	start(t, foreign.Run)
	foreignAt := foreign.State().Position()
	if st := foreign.State(); st.Foreign != "attacker/consumer-x1" || st.Mode != protocol.ModeHold {
		t.Fatalf("the copy in another namespace's pod does not hold as foreign: %+v", st)
	}
	if _, err := foreign.Control(context.Background(), protocol.Control{Type: protocol.Resume}); err == nil || !strings.Contains(err.Error(), "no migration named") {
		t.Fatalf("a foreign copy obeyed RESUME: %v", err)
	}
	onChannel(t, f, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(protocol.MigrationQueueName(f.queue), false, false, false)
		return err
	})
	// The rightful copy resuming on its own (no migration runs) shows
	// that the foreign one had the same chances to.
	rightfulResumes(t, src)
	if st := foreign.State(); st.Position() != foreignAt || st.RestoredAgain != 0 || st.Mode != protocol.ModeHold {
		t.Fatalf("the foreign copy consumed or resumed (restored at %s): %+v", foreignAt, st)
	}
}

// TestCopyInAPodThatForgesItsHomeNeverConsumes: a pod of another namespace
// can take the name of the migration's target (spec.hostname) and mount a
// namespace file of its choosing; it cannot mount the victim namespace's
// control token. The copy restored into it holds for good, also once no
// migration runs, while the copy in the real target resumes.
func TestCopyInAPodThatForgesItsHomeNeverConsumes(t *testing.T) {
	f, src := preparedSource(t)
	onChannel(t, f, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(protocol.MigrationQueueName(f.queue), false, false, false)
		return err
	})

	thieves := map[string]*Consumer{
		"a token of its own": restoredCopyInPod(src, "team/consumer-x1", tokenFileWith(t, "the-thiefs-token")),
		"no token":           restoredCopyInPod(src, "team/consumer-x1", filepath.Join(t.TempDir(), "absent")),
	}
	restoredAt := src.State().Position()
	for name, thief := range thieves {
		start(t, thief.Run)
		if st := thief.State(); st.Foreign != "team/consumer-x1" || st.Mode != protocol.ModeHold {
			t.Fatalf("with %s, the copy in a pod forging the target's name and namespace does not hold as foreign: %+v", name, st)
		}
	}
	// The rightful copy resuming on its own (no migration runs) shows
	// that the forging ones had the same chances to.
	rightfulResumes(t, src)
	for name, thief := range thieves {
		if st := thief.State(); st.Position().Seq > restoredAt.Seq || st.RestoredAgain != 0 || st.Mode != protocol.ModeHold {
			t.Fatalf("with %s, the forging copy consumed or resumed (restored at %s): %+v", name, restoredAt, st)
		}
	}
}
