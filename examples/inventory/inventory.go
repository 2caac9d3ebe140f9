package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
)

// Order is a message's body: this application's own schema. Nothing in it
// is MS2M's; the identity the migration needs travels in the headers.
type Order struct {
	SKU   string `json:"sku"`
	Delta int64  `json:"delta"` // units received (+) or shipped (−)
}

// Inventory is the consumer's state: units in stock per SKU, in memory
// only. A migration carries it in the checkpoint.
type Inventory struct {
	mu    sync.Mutex
	stock map[string]int64
}

// Apply books one order.
func (inv *Inventory) Apply(body []byte) error {
	var o Order
	if err := json.Unmarshal(body, &o); err != nil || o.SKU == "" {
		return fmt.Errorf("not an order: %q", body)
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.stock == nil {
		inv.stock = map[string]int64{}
	}
	inv.stock[o.SKU] += o.Delta
	return nil
}

// Summary is what the application reports of its state: a digest of the
// whole stock, equal on two instances exactly when their stock is.
type Summary struct {
	SKUs   int    `json:"skus"`
	Units  int64  `json:"units"`
	Digest string `json:"digest"`
}

// Summary digests the stock in SKU order.
func (inv *Inventory) Summary() any {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	skus := slices.Sorted(maps.Keys(inv.stock))
	var b strings.Builder
	s := Summary{SKUs: len(skus)}
	for _, sku := range skus {
		fmt.Fprintf(&b, "%s=%d\n", sku, inv.stock[sku])
		s.Units += inv.stock[sku]
	}
	sum := sha256.Sum256([]byte(b.String()))
	s.Digest = hex.EncodeToString(sum[:])
	return s
}

// nextOrder is the producer's order number seq: the same every run, spread
// over 40 SKUs.
func nextOrder(seq uint64) []byte {
	b, _ := json.Marshal(Order{SKU: fmt.Sprintf("sku-%02d", seq*31%40), Delta: int64(seq*7919%21) - 10})
	return b
}
