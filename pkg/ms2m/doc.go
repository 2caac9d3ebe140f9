// Package ms2m is the application side of the MS2M migration contract.
//
// A stateful consumer that embeds Consumer can be live-migrated by
// kubectl-migrate: it applies sequenced messages from a primary queue,
// deduplicates by sequence, obeys control messages (replay from a queue,
// replay up to a sequence, switch back to the primary queue, stop), reports
// its state over HTTP, and reconnects to the broker after it has been
// restored from a checkpoint on another node.
//
// The wire protocol is plain JSON over HTTP and AMQP so that other languages
// can implement it; README.md documents it.
package ms2m
