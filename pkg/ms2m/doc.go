// Package ms2m is the application side of the MS2M migration contract
// (docs/contract.md), for Go.
//
// An application gives NewConsumer its message handler and gets the rest of
// what kubectl-migrate needs to live-migrate it: messages identified by
// their AMQP headers and applied exactly once, retries and a park queue for
// messages it cannot apply, the control messages (hold, replay from a queue
// up to a position, switch back to the primary queue, stop), the HTTP
// endpoints, and a reconnect at once after a restore on another node — in a
// pod the migration named, and nowhere else. Its producers publish through
// Publisher, which stamps each message's identity and waits for the
// broker's confirm.
//
// The wire protocol (package protocol) is JSON over HTTP and AMQP headers,
// so that other languages can implement it; this package is the SDK an
// application imports, and nothing of the migration manager's.
package ms2m
