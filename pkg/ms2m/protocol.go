package ms2m

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"time"
)

// HTTP paths served by an MS2M application.
const (
	StatePath   = "/ms2m/state"
	ControlPath = "/ms2m/control"
	AppliedPath = "/ms2m/applied"
)

// ReplayQueueSuffix names the replay queue of a primary queue.
const ReplayQueueSuffix = ".ms2m-replay"

// ReplayQueueName returns the replay queue for primary.
func ReplayQueueName(primary string) string { return primary + ReplayQueueSuffix }

// MigrationQueueName returns the queue that exists, unbound and empty, while
// a migration of the consumer of primary runs: from before its checkpoint
// until it ended for good (recovery included). A copy restored from a
// checkpoint holds while it exists; once it is gone the copy was restored
// again by a container restart after the migration, and takes its primary
// queue back on its own.
func MigrationQueueName(primary string) string { return primary + ".ms2m-migration" }

// Message is the body of every message, JSON-encoded. A message with a
// Marker is not data: the migration manager publishes it to the exchange
// after binding the replay queue, and a consumer that takes it from its
// primary queue has applied every message published before the replay queue
// existed (queues are FIFO). Consumers record the marker and skip it.
type Message struct {
	Seq    uint64    `json:"seq,omitempty"`
	Value  int64     `json:"value,omitempty"`
	Sent   time.Time `json:"sent"`
	Marker string    `json:"marker,omitempty"`
}

// ControlType names a control message.
type ControlType string

// Control messages, in the order a migration uses them.
const (
	// Prepare marks the state that is about to be checkpointed: a copy restored
	// from it holds (consumes nothing) until told what to do. The running
	// source is not affected.
	Prepare ControlType = "PREPARE"
	// Checkpointed tells the source that its checkpoint is taken, so the mark
	// set by Prepare is cleared from its live memory.
	Checkpointed ControlType = "CHECKPOINTED"
	// StartReplay makes the instance consume Payload.Queue, skipping sequences
	// it has already applied.
	StartReplay ControlType = "START_REPLAY"
	// EndReplay makes the instance replay until it has applied Payload.UntilSeq,
	// then switch to the primary queue.
	EndReplay ControlType = "END_REPLAY"
	// Stop makes the instance stop consuming; unacknowledged messages return
	// to the queue. The reply carries the last applied sequence.
	Stop ControlType = "STOP"
	// Resume makes the instance consume the primary queue again and clears any
	// pending restore mark (rollback and stop-and-copy).
	Resume ControlType = "RESUME"
)

// Control is a control message, POSTed as JSON to ControlPath.
type Control struct {
	Type    ControlType    `json:"type"`
	Payload ControlPayload `json:"payload,omitempty"`
}

// ControlPayload carries the arguments of a control message.
type ControlPayload struct {
	Queue     string `json:"queue,omitempty"`
	UntilSeq  uint64 `json:"untilSeq,omitempty"`
	Migration string `json:"migration,omitempty"`
}

// Mode is what an instance is consuming.
type Mode string

// Modes of an instance.
const (
	ModePrimary Mode = "primary"
	ModeReplay  Mode = "replay"
	ModeHold    Mode = "hold"
)

// Totals summarise a set of messages so that two sets can be compared
// without listing them: the consumer's applied set and the producer's sent
// set are equal (no loss, no duplicate) exactly when their Totals are.
type Totals struct {
	Count  uint64 `json:"count"`
	Sum    int64  `json:"sum"`
	Digest string `json:"digest"`
	digest uint64
}

// Add accounts for one message.
func (t *Totals) Add(m Message) {
	t.Count++
	t.Sum += m.Value
	t.digest += seqHash(m.Seq) // a sum of hashes: order-independent, counts duplicates
	t.Digest = fmt.Sprintf("%016x", t.digest)
}

// SequenceDigest is the Digest of a set holding each sequence number from 1
// to last exactly once: what an instance that applied a producer's messages
// 1..last without loss or repetition reports.
func SequenceDigest(last uint64) string {
	var d uint64
	for seq := uint64(1); seq <= last; seq++ {
		d += seqHash(seq)
	}
	return fmt.Sprintf("%016x", d)
}

func seqHash(seq uint64) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	_, _ = h.Write(b[:])
	return h.Sum64()
}

// State is what an instance reports at StatePath and in reply to a control
// message.
type State struct {
	Mode          Mode      `json:"mode"`
	Queue         string    `json:"queue,omitempty"`
	Totals        Totals    `json:"totals"`
	LastSeq       uint64    `json:"lastSeq"`
	LastAppliedAt time.Time `json:"lastAppliedAt,omitzero"`
	Skipped       uint64    `json:"skipped"`
	Reconnects    uint64    `json:"reconnects"`
	// Barrier is the last marker taken from a queue.
	Barrier string `json:"barrier,omitempty"`
	// PendingRestore is set between Prepare and Checkpointed.
	PendingRestore bool `json:"pendingRestore,omitempty"`
	// UntilSeq is the replay bound set by EndReplay.
	UntilSeq uint64 `json:"untilSeq,omitempty"`
	// SwitchedAt is when the instance last moved to the primary queue.
	SwitchedAt time.Time `json:"switchedAt,omitzero"`
	// Process identifies the running process image: it changes on restart but
	// survives a checkpoint/restore, which is how a restore is told apart
	// from a restart.
	Process string `json:"process"`
	// StartedAt is when the process first started (kept across restore).
	StartedAt time.Time `json:"startedAt"`
	// RestoredAgain counts how often this copy came back from its
	// checkpoint with no migration running (its container restarted): each
	// time its state went back to the checkpoint's, and it resumed its
	// primary queue on its own.
	RestoredAgain uint64 `json:"restoredAgain,omitempty"`
}

// Applied records when one message was applied, answered at AppliedPath.
type Applied struct {
	Seq       uint64    `json:"seq"`
	Sent      time.Time `json:"sent"`
	AppliedAt time.Time `json:"appliedAt"`
	Queue     string    `json:"queue"`
}
