package protocol

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ContractVersion is the version of the MS2M contract (docs/contract.md)
// this package implements and reports in State.Contract. A migration
// manager refuses an application that speaks a newer one than it knows.
//
//	1: identity in the body, markers, control messages, restarts (unversioned
//	   applications report 0 and are taken for 1)
//	2: homes, target and foreign: a copy restored into a pod no migration
//	   named consumes nothing; redial at once after a restore
//	3: identity in AMQP headers, bodies opaque; totals on identity alone;
//	   messages the application cannot apply are parked, not dropped; the
//	   application's own state check in "app"
//	4: the control token: every /ms2m/ call carries the namespace's token,
//	   and a copy restored into a pod that does not mount it holds for good
const ContractVersion = 4

// TokenContract is the first contract version whose endpoints ask for the
// control token: a migration manager refuses to drive an older one.
const TokenContract = 4

// HTTP paths served by an MS2M application.
const (
	StatePath   = "/ms2m/state"
	ControlPath = "/ms2m/control"
	AppliedPath = "/ms2m/applied"
)

// ParkQueueName returns the queue where the consumer of primary sets aside
// the messages it cannot apply, each with a HeaderParked reason: durable,
// so nothing is dropped, for the application's operators to inspect.
func ParkQueueName(primary string) string { return primary + ".ms2m-parked" }

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

// Message identity travels in AMQP headers, so that bodies are the
// application's own bytes. A producer stamps each message with its run and
// sequence (Publisher does); the migration manager's marker carries only
// HeaderMarker.
//
// HeaderProducer identifies the producer's run: sequences start at 1 again
// when a producer restarts, and a consumer that compared sequences alone
// would skip the new run's messages as already applied.
const (
	HeaderProducer = "ms2m-producer" // string: the producer run's ID
	HeaderSeq      = "ms2m-seq"      // integer (any width) or decimal string, from 1 within a run
	HeaderSent     = "ms2m-sent"     // optional integer: Unix nanoseconds at publishing
	HeaderMarker   = "ms2m-marker"   // string: the migration's marker, on a message that is not data
	HeaderParked   = "ms2m-parked"   // string: why a consumer set the message aside
)

// Identity is what a message's headers say about it.
type Identity struct {
	Position
	Sent   time.Time // zero if the producer did not stamp it
	Marker string    // set on the migration manager's marker, which has no Position
}

// Identify reads a message's identity from its headers. A message with
// neither a marker nor a sequence has no identity: a consumer cannot tell
// whether it applied it already, and parks it.
func Identify(h amqp.Table) (Identity, error) {
	var id Identity
	if m, ok := h[HeaderMarker].(string); ok && m != "" {
		id.Marker = m
		return id, nil
	}
	seq, err := headerUint(h, HeaderSeq)
	if err != nil {
		return id, err
	}
	if seq == 0 {
		return id, fmt.Errorf("header %s is 0; sequences start at 1", HeaderSeq)
	}
	id.Seq = seq
	switch p := h[HeaderProducer].(type) {
	case nil:
	case string:
		id.Producer = p
	case []byte:
		id.Producer = string(p)
	default:
		return id, fmt.Errorf("header %s is a %T, not a string", HeaderProducer, p)
	}
	if ns, err := headerUint(h, HeaderSent); err == nil && ns > 0 {
		id.Sent = time.Unix(0, int64(ns))
	}
	return id, nil
}

// headerUint reads an unsigned integer header of any AMQP integer width, or
// a decimal string (some clients cannot choose the width).
func headerUint(h amqp.Table, name string) (uint64, error) {
	switch v := h[name].(type) {
	case nil:
		return 0, fmt.Errorf("no %s header", name)
	case int8:
		return nonNegative(name, int64(v))
	case int16:
		return nonNegative(name, int64(v))
	case int32:
		return nonNegative(name, int64(v))
	case int64:
		return nonNegative(name, v)
	case int:
		return nonNegative(name, int64(v))
	case uint8:
		return uint64(v), nil
	case uint16:
		return uint64(v), nil
	case uint32:
		return uint64(v), nil
	case uint64:
		return v, nil
	case string:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("header %s %q is not a decimal number", name, v)
		}
		return n, nil
	default:
		return 0, fmt.Errorf("header %s is a %T, not an integer", name, v)
	}
}

func nonNegative(name string, n int64) (uint64, error) {
	if n < 0 {
		return 0, fmt.Errorf("header %s is negative (%d)", name, n)
	}
	return uint64(n), nil
}

// Stamp returns h (a new table if nil) with the identity of the message at
// p, sent at sent.
func Stamp(h amqp.Table, p Position, sent time.Time) amqp.Table {
	if h == nil {
		h = amqp.Table{}
	}
	h[HeaderProducer] = p.Producer
	h[HeaderSeq] = int64(p.Seq)
	h[HeaderSent] = sent.UnixNano()
	return h
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
	// EndReplay makes the instance replay until it has applied the message
	// at Payload.UntilSeq of Payload.UntilProducer (EndReplayAt),
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
	Queue         string `json:"queue,omitempty"`
	UntilProducer string `json:"untilProducer,omitempty"`
	UntilSeq      uint64 `json:"untilSeq,omitempty"`
	Migration     string `json:"migration,omitempty"`
	// Target is "NAMESPACE/POD" of the pod the checkpoint about to be taken
	// is restored into (PREPARE, STOP): a copy restored anywhere else holds.
	Target string `json:"target,omitempty"`
}

// EndReplayAt is the EndReplay message that ends a replay once p is applied.
func EndReplayAt(p Position) Control {
	return Control{Type: EndReplay, Payload: ControlPayload{UntilProducer: p.Producer, UntilSeq: p.Seq}}
}

// Position is a place in the stream of messages: a producer run's sequence.
type Position struct {
	Producer string `json:"producer,omitempty"`
	Seq      uint64 `json:"seq"`
}

func (p Position) String() string {
	if p.Producer == "" {
		return fmt.Sprint(p.Seq)
	}
	return fmt.Sprintf("%d of producer %s", p.Seq, p.Producer)
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
//
// They are computed from identities alone: what a body means is the
// application's, and so is any check of it (State.App).
type Totals struct {
	Count  uint64 `json:"count"`
	Digest string `json:"digest"`
	digest uint64
}

// Add accounts for the message at p.
func (t *Totals) Add(p Position) {
	t.Count++
	t.addDigest(messageHash(p.Producer, p.Seq)) // a sum of hashes: order-independent, counts duplicates
}

// Equal reports whether two sets have the same totals (however each was
// obtained: added up here or read from JSON).
func (t Totals) Equal(o Totals) bool {
	return t.Count == o.Count && t.digestValue() == o.digestValue()
}

// Plus returns the totals of both sets together: what a consumer that
// applied the messages of two producer runs reports, from the totals each
// run's producer reported.
func (t Totals) Plus(o Totals) Totals {
	sum := Totals{Count: t.Count + o.Count}
	sum.addDigest(t.digestValue() + o.digestValue())
	return sum
}

func (t *Totals) addDigest(h uint64) {
	t.digest = t.digestValue() + h
	t.Digest = fmt.Sprintf("%016x", t.digest)
}

// digestValue reads the digest from its JSON form when the totals came over
// the wire.
func (t Totals) digestValue() uint64 {
	if t.digest == 0 && t.Digest != "" {
		d, _ := strconv.ParseUint(t.Digest, 16, 64)
		return d
	}
	return t.digest
}

// SequenceDigest is the Digest of a set holding each sequence number from 1
// to last of one producer run exactly once: what an instance that applied
// that run's messages 1..last without loss or repetition reports.
func SequenceDigest(producer string, last uint64) string {
	var d uint64
	for seq := uint64(1); seq <= last; seq++ {
		d += messageHash(producer, seq)
	}
	return fmt.Sprintf("%016x", d)
}

// messageHash is FNV-1a of the sequence's 8 big-endian bytes, preceded by
// the producer run's ID when there is one.
func messageHash(producer string, seq uint64) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(producer))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	_, _ = h.Write(b[:])
	return h.Sum64()
}

// State is what an instance reports at StatePath and in reply to a control
// message.
type State struct {
	// Contract is the ContractVersion the application implements.
	Contract int    `json:"contract,omitempty"`
	Mode     Mode   `json:"mode"`
	Queue    string `json:"queue,omitempty"`
	Totals   Totals `json:"totals"`
	// Producer and LastSeq are the last message applied: its producer run
	// and sequence.
	Producer string `json:"producer,omitempty"`
	LastSeq  uint64 `json:"lastSeq"`
	// RetiredProducers are earlier producer runs, the latest last: every one
	// of their messages precedes Producer's (one producer at a time, FIFO
	// queues), so any that comes again is a duplicate.
	RetiredProducers []string  `json:"retiredProducers,omitempty"`
	LastAppliedAt    time.Time `json:"lastAppliedAt,omitzero"`
	Skipped          uint64    `json:"skipped"`
	// ServiceMillis is how long applying one message takes, on average over
	// the last ones (receipt to acknowledgement): 1000/ServiceMillis is the
	// instance's processing rate μ, which a migration plan predicts with.
	ServiceMillis float64 `json:"serviceMillis,omitempty"`
	Reconnects    uint64  `json:"reconnects"`
	// Barrier is the last marker taken from a queue.
	Barrier string `json:"barrier,omitempty"`
	// PendingRestore is set between Prepare and Checkpointed.
	PendingRestore bool `json:"pendingRestore,omitempty"`
	// UntilProducer and UntilSeq are the replay bound set by EndReplay.
	UntilProducer string `json:"untilProducer,omitempty"`
	UntilSeq      uint64 `json:"untilSeq,omitempty"`
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
	// Homes are the pods ("NAMESPACE/POD") this state may run in: the one
	// the process started in and the targets migrations named.
	Homes []string `json:"homes,omitempty"`
	// Foreign is the pod a copy found itself restored into that is none of
	// Homes: such a copy holds for good and obeys no control but STOP.
	Foreign string `json:"foreign,omitempty"`
	// Parked counts messages set aside on the park queue unapplied: with no
	// identity, or that the handler failed on MaxAttempts times. The
	// applied set plus the parked ones is what was delivered.
	Parked uint64 `json:"parked,omitempty"`
	// App is the application's own account of its state (ConsumerConfig.AppState),
	// for checks beyond the totals: e.g. a digest of its data.
	App json.RawMessage `json:"app,omitempty"`
}

// Position is the last message the instance applied.
func (s State) Position() Position { return Position{Producer: s.Producer, Seq: s.LastSeq} }

// Reached reports whether the instance has applied the message at p, or one
// after it.
func (s State) Reached(p Position) bool {
	switch {
	case p.Producer == s.Producer:
		return s.LastSeq >= p.Seq
	case p.Seq == 0 && p.Producer == "":
		return true // nothing to reach
	default:
		return slices.Contains(s.RetiredProducers, p.Producer)
	}
}

// MaxRetiredProducers bounds RetiredProducers: a duplicate from a run that
// many restarts ago would have to outlive that many producer runs in a queue.
const MaxRetiredProducers = 32

// Applied records when one message was applied, answered at AppliedPath.
type Applied struct {
	Producer  string    `json:"producer,omitempty"`
	Seq       uint64    `json:"seq"`
	Sent      time.Time `json:"sent"`
	AppliedAt time.Time `json:"appliedAt"`
	Queue     string    `json:"queue"`
}
