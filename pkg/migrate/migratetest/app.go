package migratetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// The world's applications: the MS2M contract's control endpoint, and
// the conservation check over what they applied.

// runningPods lists the pods that exist (not being deleted) and whose
// application matches.
func (w *World) runningPods(match func(st *protocol.State, restored bool) bool) []string {
	pods, err := w.Client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), "default")
	if err != nil {
		return nil
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	var names []string
	for _, p := range pods.(*corev1.PodList).Items {
		if st := w.Apps[p.Name]; st != nil && p.DeletionTimestamp == nil && match(st, w.restored[p.Name]) {
			names = append(names, p.Name)
		}
	}
	return names
}

// serve puts pod's application on the primary queue (w.Mu held). The
// producer goes on meanwhile, and the copy consumes what arrives: a copy
// whose state lacks what another copy of it acknowledged has lost those
// messages, as the real consumer's "sequence gap" shows.
func (w *World) serve(pod string, st *protocol.State) {
	if acked := w.acked[st.Process]; st.LastSeq < acked {
		w.violations = append(w.violations, fmt.Sprintf("%s resumed the primary queue at %d, but copies of its state had acknowledged up to %d: %d messages lost", pod, st.LastSeq, acked, acked-st.LastSeq))
	}
	st.Mode, st.PendingRestore = protocol.ModePrimary, false
	w.published += 10
	st.LastSeq = w.published
	w.acked[st.Process] = st.LastSeq
}

// Conservation returns the breaches of conservation the world saw, and
// those it sees now: every lineage of state must be served by exactly one
// running pod, and that pod's state must hold every message any copy of it
// acknowledged.
func (w *World) Conservation() error {
	serving := map[string][]string{}
	for _, pod := range w.runningPods(func(st *protocol.State, _ bool) bool { return st.Mode != protocol.ModeHold }) {
		if w.isolated(pod) {
			continue
		}
		w.Mu.Lock()
		serving[w.Apps[pod].Process] = append(serving[w.Apps[pod].Process], pod)
		w.Mu.Unlock()
	}
	w.Mu.Lock()
	defer w.Mu.Unlock()
	problems := slices.Clone(w.violations)
	for process, acked := range w.acked {
		pods := serving[process]
		switch {
		case len(pods) != 1:
			problems = append(problems, fmt.Sprintf("state %s is served by %d pods %v, want 1", process, len(pods), pods))
		case w.Apps[pods[0]].LastSeq < acked:
			problems = append(problems, fmt.Sprintf("%s serves state %s at %d, but %d was acknowledged", pods[0], process, w.Apps[pods[0]].LastSeq, acked))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("conservation broken: %s", strings.Join(problems, "; "))
	}
	return nil
}

// isolated tells whether pod is cut off the network.
func (w *World) isolated(pod string) bool {
	w.Mu.Lock()
	defer w.Mu.Unlock()
	return w.Isolated[pod]
}

type fakeApp World

// refused is how an application answers a call without its token, or
// one without the MS2M contract any call.
func (f *fakeApp) refused(t appctl.Target) error {
	w := (*World)(f)
	w.Mu.Lock()
	noContract, frozen := w.NoContract, w.frozen[t.Pod]
	w.Mu.Unlock()
	if noContract {
		return fmt.Errorf("%s: connection refused (no MS2M endpoint)", t)
	}
	if frozen {
		return fmt.Errorf("%s: no answer: its process is frozen until its pages have left", t)
	}
	if t.Token == ControlToken {
		return nil
	}
	return fmt.Errorf("%s: the application refused the call: missing or wrong %s header", t, protocol.TokenHeader)
}

func (f *fakeApp) State(ctx context.Context, t appctl.Target) (protocol.State, error) {
	if err := f.refused(t); err != nil {
		return protocol.State{}, err
	}
	w := (*World)(f)
	w.Mu.Lock()
	if w.Stalled[t.Pod] > 0 {
		w.Stalled[t.Pod]--
		w.Mu.Unlock()
		<-ctx.Done()
		w.Mu.Lock()
		w.StallEnds = append(w.StallEnds, ctx.Err())
		w.Mu.Unlock()
		return protocol.State{}, ctx.Err()
	}
	defer w.Mu.Unlock()
	st, ok := w.Apps[t.Pod]
	if w.Unanswered[t.Pod] > 0 {
		w.Unanswered[t.Pod]--
		ok = false
	}
	if !ok {
		return protocol.State{}, fmt.Errorf("%s unreachable", t)
	}
	if w.replaying[t.Pod] && st.Mode == protocol.ModeReplay {
		// It replays what the source applies meanwhile, as it arrives.
		st.LastSeq = max(st.LastSeq, w.published)
	}
	answer := *st
	if w.reconnecting[t.Pod] {
		delete(w.reconnecting, t.Pod)
		st.Mode = protocol.ModeHold
	}
	return answer, nil
}

func (f *fakeApp) Control(_ context.Context, t appctl.Target, msg protocol.Control) (protocol.State, error) {
	if err := f.refused(t); err != nil {
		return protocol.State{}, err
	}
	w := (*World)(f)
	w.record("control %s %s", t.Pod, msg.Type)
	if msg.Type == protocol.Stop && w.fail(report.Switchover) != nil {
		return protocol.State{}, ErrInjected
	}
	stuck := msg.Type == protocol.StartReplay && w.fail(report.Replay) != nil
	w.Mu.Lock()
	defer w.Mu.Unlock()
	st, ok := w.Apps[t.Pod]
	if !ok {
		return protocol.State{}, fmt.Errorf("%s unreachable", t)
	}
	switch msg.Type {
	case protocol.Prepare:
		st.PendingRestore = true
	case protocol.Checkpointed:
		st.PendingRestore = false
		st.LastSeq += 10 // the source goes on after the checkpoint, at 10/s
		st.LastAppliedAt = st.LastAppliedAt.Add(time.Second)
		w.published = max(w.published, st.LastSeq)
	case protocol.Stop:
		st.Mode = protocol.ModeHold
	case protocol.Resume, protocol.EndReplay:
		w.serve(t.Pod, st)
	case protocol.StartReplay:
		st.Mode, st.PendingRestore = protocol.ModeReplay, false
		if !stuck {
			st.LastSeq = w.published // caught up at once
			w.replaying[t.Pod] = true
		}
	}
	return *st, nil
}

func (f *fakeApp) AppliedAfter(_ context.Context, t appctl.Target, p protocol.Position) (protocol.Applied, error) {
	if err := f.refused(t); err != nil {
		return protocol.Applied{}, err
	}
	w := (*World)(f)
	w.Mu.Lock()
	defer w.Mu.Unlock()
	var last time.Time
	for _, st := range w.Apps {
		if st.LastAppliedAt.After(last) {
			last = st.LastAppliedAt
		}
	}
	if delay, ok := w.AppliedDelay[t.Pod]; ok {
		if _, running := w.Apps[t.Pod]; !running {
			return protocol.Applied{}, fmt.Errorf("%s unreachable", t)
		}
		sent := last.Add(time.Second) // after the source stopped: the gap is the delay
		return protocol.Applied{Producer: p.Producer, Seq: p.Seq + 1, Sent: sent, AppliedAt: sent.Add(delay)}, nil
	}
	return protocol.Applied{Producer: p.Producer, Seq: p.Seq + 1, Sent: last.Add(-time.Second), AppliedAt: last.Add(1500 * time.Millisecond)}, nil
}
