// Package sample is the application of the MS2M evaluation: each message
// carries a value, and the consumer's state is their sum, which takes Work
// per message to update. Producer and consumer keep the same sum, so a
// migration that lost or repeated a message shows in it beside the totals.
package sample

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

// Reading is a message's body.
type Reading struct {
	Value int64 `json:"value"`
}

// Body is the body of message seq: values spread over 1..1000.
func Body(seq uint64) []byte {
	b, _ := json.Marshal(Reading{Value: int64(seq*7919%1000) + 1})
	return b
}

// State is the application's own state, reported as ms2m's "app".
type State struct {
	Sum int64 `json:"sum"`
}

// Sum is the sum of the values applied (by a consumer) or confirmed (by a
// producer).
type Sum struct {
	mu  sync.Mutex
	sum int64
}

// Add adds one body's value.
func (s *Sum) Add(body []byte) error {
	var r Reading
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("not a reading: %w", err)
	}
	s.mu.Lock()
	s.sum += r.Value
	s.mu.Unlock()
	return nil
}

// State reports the sum.
func (s *Sum) State() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return State{Sum: s.sum}
}

// Handler applies a message in work (the paper's service time), then adds
// its value.
func (s *Sum) Handler(work time.Duration) ms2m.HandlerFunc {
	return func(ctx context.Context, d ms2m.Delivery) error {
		if work > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(work):
			}
		}
		return s.Add(d.Body)
	}
}
