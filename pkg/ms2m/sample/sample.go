// Package sample is the application of the MS2M evaluation: each message
// carries a value, and the consumer's state is their sum, which takes Work
// per message to update. Producer and consumer keep the same sum, so a
// migration that lost or repeated a message shows in it beside the totals.
package sample

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
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
	// LedgerSum and LedgerLines are read back from the ledger file, when
	// there is one: equal to Sum and the messages applied when the file
	// holds each applied value exactly once.
	LedgerSum   int64  `json:"ledgerSum,omitempty"`
	LedgerLines int    `json:"ledgerLines,omitempty"`
	LedgerError string `json:"ledgerError,omitempty"`
}

// Sum is the sum of the values applied (by a consumer) or confirmed (by a
// producer).
type Sum struct {
	mu  sync.Mutex
	sum int64
	// ledger, if set, gets each applied value as a line: state on disk (an
	// emptyDir in the lab) beside the state in memory, which a migration
	// must carry together.
	ledger *os.File
}

// KeepLedger appends each value applied from now on to the file at path,
// kept open for the process's life (as an application keeps its files).
func (s *Sum) KeepLedger(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	s.ledger = f
	return nil
}

// Add adds one body's value.
func (s *Sum) Add(body []byte) error {
	var r Reading
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("not a reading: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ledger != nil {
		if _, err := fmt.Fprintln(s.ledger, r.Value); err != nil {
			return fmt.Errorf("ledger: %w", err)
		}
	}
	s.sum += r.Value
	return nil
}

// State reports the sum, and what the ledger file holds.
func (s *Sum) State() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := State{Sum: s.sum}
	if s.ledger != nil {
		data, err := os.ReadFile(s.ledger.Name())
		if err != nil {
			st.LedgerError = err.Error()
		}
		for _, line := range strings.Fields(string(data)) {
			v, err := strconv.ParseInt(line, 10, 64)
			if err != nil {
				st.LedgerError = "not a value: " + line
				break
			}
			st.LedgerSum += v
			st.LedgerLines++
		}
	}
	return st
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
