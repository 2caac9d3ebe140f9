package ms2m

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
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
	// Body returns the body of the message at seq (default: empty).
	Body        func(seq uint64) []byte
	ContentType string
	// Confirmed, if set, is told each message the broker confirmed, so the
	// application can keep its own account of what was sent (AppState).
	Confirmed func(seq uint64, body []byte)
	// AppState, if set, is reported as ProducerState.App: what a consumer
	// that applied exactly the confirmed messages reports as its State.App.
	AppState func() any
	Logf     func(format string, args ...any)
	// TokenFile is where the pod mounts the control token its endpoints
	// ask for (default TokenFile()).
	TokenFile string
}

// ProducerState is what a producer reports at StatePath: Totals are those of
// the messages the broker confirmed.
type ProducerState struct {
	// Producer names this run of the producer: chosen at start, sent with
	// every message, so a restarted producer's sequences (from 1 again) are
	// not taken for ones already applied.
	Producer string          `json:"producer"`
	Totals   protocol.Totals `json:"totals"`
	LastSeq  uint64          `json:"lastSeq"`
	Stopped  bool            `json:"stopped"`
	// App is the application's account of what was confirmed
	// (ProducerConfig.AppState).
	App json.RawMessage `json:"app,omitempty"`
}

// Position is the last message the broker confirmed.
func (s ProducerState) Position() protocol.Position {
	return protocol.Position{Producer: s.Producer, Seq: s.LastSeq}
}

// Producer is a load generator for trying and testing MS2M consumers: it
// publishes messages at a fixed rate through a Publisher and counts what
// the broker confirmed.
type Producer struct {
	cfg  ProducerConfig
	pub  *Publisher
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
	if cfg.Body == nil {
		cfg.Body = func(uint64) []byte { return nil }
	}
	pub := NewPublisher(PublisherConfig{URL: cfg.URL, Exchange: cfg.Exchange, Queue: cfg.Queue, Logf: cfg.Logf})
	if cfg.TokenFile == "" {
		cfg.TokenFile = TokenFile()
	}
	return &Producer{cfg: cfg, pub: pub, st: ProducerState{Producer: pub.Run()}, stop: make(chan struct{})}
}

// State returns a snapshot of what was confirmed.
func (p *Producer) State() ProducerState {
	p.mu.Lock()
	st := p.st
	p.mu.Unlock()
	st.App = appJSON(p.cfg.AppState)
	return st
}

// lastSeq is the last sequence confirmed, without State's encoding of the
// application's account: the publish loop asks for it per message.
func (p *Producer) lastSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st.LastSeq
}

// Stop ends publishing; Run returns after the message in flight is confirmed.
func (p *Producer) Stop() { p.once.Do(func() { close(p.stop) }) }

// Run publishes until ctx ends, Stop is called or Count is reached. A message
// is counted once confirmed; the Publisher retries an unconfirmed one with
// the same identity, which consumers skip if it did arrive.
func (p *Producer) Run(ctx context.Context) error {
	if p.cfg.Rate <= 0 {
		return fmt.Errorf("rate must be positive, got %v", p.cfg.Rate)
	}
	defer func() { p.mu.Lock(); p.st.Stopped = true; p.mu.Unlock() }()
	defer p.pub.Close()
	tick := time.NewTicker(time.Duration(float64(time.Second) / p.cfg.Rate))
	defer tick.Stop()
	for {
		if p.cfg.Count > 0 && p.lastSeq() >= p.cfg.Count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.stop:
			return nil
		case <-tick.C:
		}
		// Stop waits for the message in flight: Publish runs to its confirm.
		seq := p.lastSeq() + 1
		body := p.cfg.Body(seq)
		at, err := p.pub.Publish(ctx, amqp.Publishing{ContentType: p.cfg.ContentType, MessageId: fmt.Sprint(seq), Timestamp: time.Now(), Body: body})
		if err != nil {
			return nil // ctx ended; Publish retries everything else
		}
		if p.cfg.Confirmed != nil {
			p.cfg.Confirmed(at.Seq, body)
		}
		p.mu.Lock()
		p.st.Totals.Add(at)
		p.st.LastSeq = at.Seq
		p.mu.Unlock()
	}
}

// Handler serves GET StatePath and POST ControlPath (only Stop) to callers
// with the control token, as a consumer's do; and GET /healthz.
func (p *Producer) Handler() http.Handler {
	token, tokenErr := ReadToken(p.cfg.TokenFile)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+protocol.StatePath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, p.State())
	})
	mux.HandleFunc("POST "+protocol.ControlPath, func(w http.ResponseWriter, r *http.Request) {
		var msg protocol.Control
		if err := json.NewDecoder(r.Body).Decode(&msg); err != nil || msg.Type != protocol.Stop {
			http.Error(w, "a producer only accepts {\"type\":\"STOP\"}", http.StatusBadRequest)
			return
		}
		p.Stop()
		writeJSON(w, http.StatusOK, p.State())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) })
	return requireToken(token, tokenErr, mux)
}
