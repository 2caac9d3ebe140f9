package ms2m

import (
	"context"
	"fmt"
	"time"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// Control applies a control message and returns the state once the consume
// loop has acted on it (for Stop: once nothing consumes any more).
func (c *Consumer) Control(ctx context.Context, msg protocol.Control) (protocol.State, error) {
	done, err := c.control(msg)
	if err != nil {
		return protocol.State{}, err
	}
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return c.State(), fmt.Errorf("%s not yet in effect: %w", msg.Type, ctx.Err())
		}
	}
	return c.State(), nil
}

func (c *Consumer) control(msg protocol.Control) (<-chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.st.Foreign != "" && msg.Type != protocol.Stop {
		return nil, fmt.Errorf("this copy runs in pod %s, which no migration named (its pods: %v); it consumes nothing", c.st.Foreign, c.st.Homes)
	}
	switch msg.Type {
	case protocol.Prepare:
		c.st.PendingRestore = true
		c.addHomeLocked(msg.Payload.Target)
		return nil, nil
	case protocol.Checkpointed:
		c.st.PendingRestore = false
		if c.held { // the connection dropped while the mark was set
			c.held = false
			c.st.Mode, c.st.Queue = protocol.ModePrimary, c.cfg.Queue
		}
	case protocol.StartReplay:
		if msg.Payload.Queue == "" {
			return nil, fmt.Errorf("%s needs payload.queue", msg.Type)
		}
		c.clearRestoreMarkLocked()
		c.st.Mode, c.st.Queue, c.st.UntilProducer, c.st.UntilSeq = protocol.ModeReplay, msg.Payload.Queue, "", 0
	case protocol.EndReplay:
		c.clearRestoreMarkLocked()
		until := protocol.Position{Producer: msg.Payload.UntilProducer, Seq: msg.Payload.UntilSeq}
		if c.st.Mode != protocol.ModeReplay || c.st.Reached(until) {
			c.toPrimaryLocked(now)
		} else {
			c.st.UntilProducer, c.st.UntilSeq = until.Producer, until.Seq
			return nil, nil // the switch happens when the bound is applied
		}
	case protocol.Stop:
		c.st.Mode, c.st.Queue = protocol.ModeHold, ""
		c.addHomeLocked(msg.Payload.Target)
	case protocol.Resume:
		c.clearRestoreMarkLocked()
		c.toPrimaryLocked(now)
	default:
		return nil, fmt.Errorf("unknown control message type %q", msg.Type)
	}
	done := make(chan struct{})
	c.waiters = append(c.waiters, done)
	c.signalLocked()
	return done, nil
}

func (c *Consumer) clearRestoreMarkLocked() {
	c.st.PendingRestore = false
	c.held = false
}
