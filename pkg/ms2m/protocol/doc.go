// Package protocol is the MS2M contract's wire (docs/contract.md): what an
// application and a migration manager say to each other. The AMQP headers
// that identify a message and the queues a migration declares, the control
// messages and the state an application reports over HTTP, the control
// token, and the totals both sides compare to prove that every message was
// applied exactly once.
//
// pkg/ms2m implements the application's side on it for Go; kubectl-migrate's
// engine speaks the manager's side. Another language implements the
// contract from this package's types and docs/contract.md.
package protocol
