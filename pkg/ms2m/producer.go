package ms2m

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ProducerConfig configures a Producer.
type ProducerConfig struct {
	URL      string
	Exchange string
	// Queue is the consumers' primary queue, declared so no message published
	// before the first consumer starts is lost.
	Queue string
	// Rate is messages per second.
	Rate float64
	// Count stops the producer after this many messages (0: no limit).
	Count uint64
	Logf  func(format string, args ...any)
}

// ProducerState is what a producer reports at StatePath: Totals are those of
// the messages the broker confirmed.
type ProducerState struct {
	// Producer names this run of the producer: chosen at start, sent with
	// every message, so a restarted producer's sequences (from 1 again) are
	// not taken for ones already applied.
	Producer string `json:"producer"`
	Totals   Totals `json:"totals"`
	LastSeq  uint64 `json:"lastSeq"`
	Stopped  bool   `json:"stopped"`
}

// Position is the last message the broker confirmed.
func (s ProducerState) Position() Position { return Position{Producer: s.Producer, Seq: s.LastSeq} }

// Producer publishes sequenced messages at a fixed rate with publisher
// confirms, and counts what the broker accepted.
type Producer struct {
	cfg  ProducerConfig
	mu   sync.Mutex
	st   ProducerState
	stop chan struct{}
	once sync.Once
}

// NewProducer returns a producer; call Run to start publishing.
func NewProducer(cfg ProducerConfig) *Producer {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	run := fmt.Sprintf("%x-%04x", time.Now().UnixNano(), rand.Uint32()>>16)
	return &Producer{cfg: cfg, st: ProducerState{Producer: run}, stop: make(chan struct{})}
}

// State returns a snapshot of what was confirmed.
func (p *Producer) State() ProducerState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

// Stop ends publishing; Run returns after the message in flight is confirmed.
func (p *Producer) Stop() { p.once.Do(func() { close(p.stop) }) }

// Run publishes until ctx ends, Stop is called or Count is reached,
// reconnecting on broker errors. A message is counted once confirmed; an
// unconfirmed one is published again with the same sequence, which
// consumers skip if it did arrive.
func (p *Producer) Run(ctx context.Context) error {
	if p.cfg.Rate <= 0 {
		return fmt.Errorf("rate must be positive, got %v", p.cfg.Rate)
	}
	defer func() { p.mu.Lock(); p.st.Stopped = true; p.mu.Unlock() }()
	for {
		err := p.session(ctx)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		p.cfg.Logf("broker session ended: %v; reconnecting", err)
		select {
		case <-ctx.Done():
			return nil
		case <-p.stop:
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (p *Producer) session(ctx context.Context) error {
	conn, err := amqp.Dial(p.cfg.URL)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := DeclareTopology(conn, p.cfg.Exchange, p.cfg.Queue); err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / p.cfg.Rate))
	defer tick.Stop()
	for {
		if p.cfg.Count > 0 && p.State().LastSeq >= p.cfg.Count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.stop:
			return nil
		case <-tick.C:
		}
		if err := p.publishNext(ctx, ch); err != nil {
			return err
		}
	}
}

func (p *Producer) publishNext(ctx context.Context, ch *amqp.Channel) error {
	st := p.State()
	seq := st.LastSeq + 1
	m := Message{Producer: st.Producer, Seq: seq, Value: int64(seq*7919%1000) + 1, Sent: time.Now()}
	body, _ := json.Marshal(m)
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, "", false, false, amqp.Publishing{
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    fmt.Sprint(seq),
		Timestamp:    m.Sent,
		Body:         body,
	})
	if err != nil {
		return err
	}
	ok, err := conf.WaitContext(ctx)
	if err != nil || !ok {
		return fmt.Errorf("message %d not confirmed: %v", seq, err)
	}
	p.mu.Lock()
	p.st.Totals.Add(m)
	p.st.LastSeq = seq
	p.mu.Unlock()
	return nil
}

// Handler serves GET StatePath and POST ControlPath (only Stop).
func (p *Producer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+StatePath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.State())
	})
	mux.HandleFunc("POST "+ControlPath, func(w http.ResponseWriter, r *http.Request) {
		var msg Control
		if err := json.NewDecoder(r.Body).Decode(&msg); err != nil || msg.Type != Stop {
			http.Error(w, "a producer only accepts {\"type\":\"STOP\"}", http.StatusBadRequest)
			return
		}
		p.Stop()
		writeJSON(w, http.StatusOK, p.State())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	return mux
}
