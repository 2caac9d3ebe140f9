package migrate

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/runtimesupport"
)

// appPollInterval paces polls of an application's state, which has no watch.
const appPollInterval = 100 * time.Millisecond

// A restored copy is asked again every appPollInterval without waiting for
// the asks before: a connection opened while CRIU restores the pod can
// stall for a second (a dropped SYN waits for the kernel's resend), while
// one opened after the restore is answered at once. Each ask may take
// askTimeout, so a slow but answering cluster is still heard; at most
// asksInFlight are open at once.
const (
	askTimeout   = 4 * time.Second
	asksInFlight = 8
)

// restore creates the target pod from the checkpoint images and waits until
// the restored application answers, proving it was restored (same process
// identity as the source) rather than started afresh.
type restore struct{}

// baseImages are the images the migrated containers were first created from.
func (m *Migration) baseImages() []string {
	var bases []string
	baseOf := BaseImages(m.state.Source)
	for _, c := range m.state.Source.Spec.Containers {
		if slices.Contains(m.state.Migrated, c.Name) {
			bases = append(bases, baseOf[c.Name])
		}
	}
	return bases
}

func (restore) Name() report.PhaseName { return report.Restore }

func (restore) Run(ctx context.Context, m *Migration) error {
	if m.state.Target != nil { // created before the checkpoint existed
		held, err := m.awaitRestored(ctx, m.config.TargetName, m.config.TargetNode, report.StagedRunning)
		if err == nil && m.config.Pages == PagesLazy && m.config.Strategy != MS2M {
			// MS2M's copy replays meanwhile (replay waits for the pages).
			err = m.awaitLastPage(ctx)
		}
		m.state.TargetRestored = held
		if saveErr := m.save(ctx); err == nil {
			err = saveErr
		}
		return err
	}
	m.state.TargetRequested = true
	m.Record.TargetPod = m.config.TargetName
	created, held, err := m.restoreAs(ctx, m.config.TargetName, m.config.TargetNode)
	if created != nil {
		m.state.Target, m.state.TargetRestored = created, held
		if saveErr := m.save(ctx); err == nil {
			err = saveErr
		}
	}
	return err
}

// createsTargetEarly: a target restored through the kubectl-migrate
// runtime is created as the migration starts changing things, before its
// checkpoint exists: the runtime holds its container's create until the
// checkpoint is staged (ociruntime.ExpectedPath), so the kubelet's part
// (noticing the pod, its volumes, sandbox and network) happens while the
// source is checkpointed, off the critical path. Not a StatefulSet
// member's name, which the source holds until detach.
func (m *Migration) createsTargetEarly() bool {
	return m.path().createsEarly(m.config.StatefulSet, m.config.TargetName)
}

// expectedIDs are the containers whose checkpoints the target expects.
func (m *Migration) expectedIDs() []ociruntime.Identity {
	ids := make([]ociruntime.Identity, 0, len(m.state.Migrated))
	for _, c := range m.state.Migrated {
		ids = append(ids, m.staged(c))
	}
	return ids
}

// createTargetEarly marks the checkpoints on their way and creates the
// target pod (createsTargetEarly); the first phase that changes anything
// (prepare, or stop-and-copy's stop) calls it before it changes the source.
func (m *Migration) createTargetEarly(ctx context.Context) error {
	if !m.createsTargetEarly() || m.state.Target != nil {
		return nil
	}
	if err := m.deps.Packer.Expect(ctx, m.config.TargetNode, m.expectedIDs()); err != nil {
		return fmt.Errorf("tell node %s's agent that the checkpoint is coming: %w", m.config.TargetNode, err)
	}
	m.state.TargetRequested = true
	m.Record.TargetPod = m.config.TargetName
	created, err := m.createTarget(ctx, m.config.TargetName, m.config.TargetNode)
	if created != nil {
		m.state.Target = created
		if saveErr := m.save(ctx); err == nil {
			err = saveErr
		}
	}
	if err != nil {
		return err
	}
	return m.awaitAddressed(ctx, m.config.TargetName, m.config.TargetNode)
}

// awaitAddressed waits until the kubelet reports the address of pod name,
// created early (addressFirst), and has moved on to creating its restoring
// containers: its address init container ended. Then the checkpoint may be
// taken, with no wait for the kubelet left on the critical path.
func (m *Migration) awaitAddressed(ctx context.Context, name, node string) error {
	start := time.Now()
	if m.phase < len(m.Record.Phases) {
		m.progress(m.Record.Phases[m.phase].Name, "waiting for the kubelet to report the address of "+name)
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	kubeletAway := m.kubeletAway(watchCtx, node)
	addressed := make(chan error, 1)
	go func() {
		_, err := kube.WaitForPod(watchCtx, m.deps.Client, m.config.Namespace, name, func(pod *corev1.Pod) (bool, error) {
			if pod == nil {
				return false, fmt.Errorf("pod %s was deleted", name)
			}
			i := slices.IndexFunc(pod.Status.InitContainerStatuses, func(s corev1.ContainerStatus) bool { return s.Name == AddressInitContainer })
			if i < 0 {
				return false, nil
			}
			switch st := pod.Status.InitContainerStatuses[i].State; {
			case st.Terminated != nil && st.Terminated.ExitCode != 0:
				return false, fmt.Errorf("its init container %s ended with exit code %d: %s", AddressInitContainer, st.Terminated.ExitCode, st.Terminated.Message)
			case st.Terminated != nil:
				return pod.Status.PodIP != "", nil
			case kube.StartFailed(st.Waiting):
				return false, fmt.Errorf("its init container %s cannot start (%s: %s); pass --agent-image with an image node %s can pull", AddressInitContainer, st.Waiting.Reason, st.Waiting.Message, node)
			}
			return false, nil
		})
		addressed <- err
	}()
	select {
	case err := <-addressed:
		if err != nil {
			return fmt.Errorf("pod %s on %s: %w", name, node, err)
		}
	case err := <-kubeletAway:
		return fmt.Errorf("pod %s cannot start on %s: %w", name, node, err)
	}
	m.step(report.PodAddressed, "", start, 0)
	return nil
}

// undoTargetEarly deletes the target createTargetEarly made, then the marks:
// in that order, since a create the kubelet tries again with no mark would
// start the application afresh.
func (m *Migration) undoTargetEarly(ctx context.Context) error {
	if !m.createsTargetEarly() {
		return nil
	}
	if m.state.TargetRequested {
		if err := (restore{}).Rollback(ctx, m); err != nil {
			return err
		}
	}
	marks := make([]string, 0, len(m.state.Migrated))
	for _, id := range m.expectedIDs() {
		marks = append(marks, agent.ExpectedPath(id))
	}
	if err := m.deps.Packer.Remove(ctx, m.nextAgentPod(), m.config.TargetNode, marks); err != nil {
		return fmt.Errorf("remove the marks of checkpoints on their way to %s %v: %w", m.config.TargetNode, marks, err)
	}
	return nil
}

// restoreAs creates pod name on node from the checkpoint images and waits
// until the restored application answers as the checkpointed process and
// holds. It returns the pod once created, even if waiting failed, and the
// state the copy held with: its checkpoint's.
//
// The node has the base images the restore builds on: preflight had the
// target pull them, and every other restore is onto a node that ran the
// checkpointed container.
func (m *Migration) restoreAs(ctx context.Context, name, node string) (*corev1.Pod, protocol.State, error) {
	created, err := m.createTarget(ctx, name, node)
	if err != nil {
		return nil, protocol.State{}, err
	}
	held, err := m.awaitRestored(ctx, name, node, report.PodRunning)
	return created, held, err
}

// createTarget creates pod name on node: from the checkpoint images, or
// through the kubectl-migrate runtime from its own images.
func (m *Migration) createTarget(ctx context.Context, name, node string) (*corev1.Pod, error) {
	pod := RestoredPod(m.state.Source, name, node, m.config.ID, m.state.Images, m.config.RegistrySecret, m.state.RestoreVia)
	if m.createsTargetEarly() && name == m.config.TargetName {
		addressFirst(pod, m.config.AgentImage)
	}
	if m.config.StatefulSet != "" {
		// Per-pod Services select this label: the StatefulSet's own name has
		// it, a shadow copy must not.
		if isMemberName(m.config.StatefulSet, name) {
			pod.Labels[appsv1.StatefulSetPodNameLabel] = name
		} else {
			delete(pod.Labels, appsv1.StatefulSetPodNameLabel)
		}
	}
	m.hideFromReplicaSet(pod)
	if err := m.save(ctx); err != nil {
		return nil, err
	}
	if err := m.path().beforeCreate(ctx, m, pod, node); err != nil {
		return nil, err
	}
	start := time.Now()
	created, err := m.deps.Client.CoreV1().Pods(m.config.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s on %s: %w", name, node, err)
	}
	if err := m.path().afterCreate(ctx, m, created, node); err != nil {
		return created, err
	}
	m.step(report.PodCreate, "", start, 0)
	m.progress(report.Restore, "pod "+name+" created on "+node)
	return created, nil
}

// awaitRestored waits until pod name on node answers as the checkpointed
// process and holds, and returns the state it held with: its checkpoint's.
// The wait is recorded as step.
func (m *Migration) awaitRestored(ctx context.Context, name, node string, step report.StepName) (protocol.State, error) {
	start := time.Now()
	// The kubelet may report the containers running only at its next
	// relist, up to a second after the restored application answers: the
	// application is asked as soon as the pod has an address, while the
	// same watch on the pod stops the wait if the restore fails.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	pod := m.watchRestoredPod(watchCtx, name, node)
	if !m.config.Strategy.Contract() {
		// No endpoint to ask: the copy is restored once its containers run
		// (a checkpoint image, or a checkpoint the runtime was told to
		// wait for, cannot start afresh).
		select {
		case err := <-pod.ended:
			if err != nil {
				return protocol.State{}, m.explainRestoreFailure(ctx, node, err)
			}
		case err := <-pod.kubeletAway:
			return protocol.State{}, pod.cannotStart(err)
		}
		m.step(step, "", start, 0)
		return protocol.State{}, nil
	}
	select {
	case <-pod.addressed:
	case err := <-pod.ended:
		if err != nil {
			return protocol.State{}, m.explainRestoreFailure(ctx, node, err)
		}
		// Running, so addressed too.
	case err := <-pod.kubeletAway:
		return protocol.State{}, pod.cannotStart(err)
	}
	m.progress(report.Restore, "pod has an address; waiting for the restored application")
	app := m.app(name)
	// The restored copy answers as soon as its listener is back, possibly
	// before it has noticed that its broker connection died; it holds only
	// after reconnecting, so wait for that.
	var st protocol.State
	var answeredAt time.Time
	podErr, err := m.askUntilHolding(ctx, app, pod, func(answer protocol.State) (bool, error) {
		st = answer
		if answeredAt.IsZero() {
			answeredAt = time.Now()
		}
		if st.Process != m.state.SourceState.Process {
			return false, fmt.Errorf("pod %s started a new process instead of restoring the checkpoint; check the target runtime's restore support", name)
		}
		return st.Mode == protocol.ModeHold, nil
	})
	switch {
	case podErr != nil:
		return st, m.explainRestoreFailure(ctx, node, podErr)
	case err != nil && answeredAt.IsZero():
		return st, fmt.Errorf("the restored application in %s never answered on port %d: %w", name, m.config.ControlPort, err)
	case err != nil && st.Process != m.state.SourceState.Process:
		return st, err
	case err != nil:
		return st, fmt.Errorf("the restored application stayed in %s mode instead of holding after its reconnect; it does not follow the MS2M contract: %w", st.Mode, err)
	}
	// Running is when the restored process first answered: the runtime's
	// work ends there, whenever the kubelet reports it.
	m.stepTook(step, "", start, answeredAt.Sub(start), 0)
	m.step(report.AppHolding, "", answeredAt, 0)
	return st, nil
}

// askUntilHolding asks app for its state, a new ask every appPollInterval
// whether or not the ones before have answered (askTimeout), and hands each
// answer to done until done says so or fails. It stops with podErr if the
// pod's watch says its containers cannot run, and with ctx.
func (m *Migration) askUntilHolding(ctx context.Context, app appctl.Target, pod *restoredPodWatch, done func(protocol.State) (bool, error)) (podErr, err error) {
	type answer struct {
		st  protocol.State
		err error
	}
	asking, stopAsking := context.WithCancel(ctx)
	defer stopAsking()
	answers := make(chan answer, asksInFlight) // room for every open ask: none blocks after the return
	open := 0
	ask := func() {
		if open == asksInFlight {
			return
		}
		open++
		go func() {
			askCtx, cancel := context.WithTimeout(asking, askTimeout)
			defer cancel()
			st, err := m.deps.App.State(askCtx, app)
			answers <- answer{st, err}
		}()
	}
	tick := time.NewTicker(appPollInterval)
	defer tick.Stop()
	ended := pod.ended
	ask()
	for {
		select {
		case <-tick.C:
			ask()
		case a := <-answers:
			open--
			if a.err != nil {
				continue
			}
			if ok, err := done(a.st); ok || err != nil {
				return nil, err
			}
		case err := <-ended:
			if err != nil {
				return err, err
			}
			ended = nil // running: only the application can say more
		case err := <-pod.kubeletAway:
			err = pod.cannotStart(err)
			return err, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// restoredPodWatch follows a restored pod while the engine waits for its
// application: addressed closes once the pod has an IP (or runs); ended
// gets the watch's end, nil once the migrated containers run, or why they
// cannot; kubeletAway, the node's kubelet stopping to answer.
type restoredPodWatch struct {
	name, node  string
	addressed   chan struct{}
	ended       chan error
	kubeletAway <-chan error
}

// watchRestoredPod watches pod name on node until ctx ends.
func (m *Migration) watchRestoredPod(ctx context.Context, name, node string) *restoredPodWatch {
	w := &restoredPodWatch{name: name, node: node, addressed: make(chan struct{}), ended: make(chan error, 1), kubeletAway: m.kubeletAway(ctx, node)}
	var once sync.Once
	running := kube.ContainersRunning("restored ", m.state.Migrated)
	go func() {
		_, err := kube.WaitForPod(ctx, m.deps.Client, m.config.Namespace, name, func(pod *corev1.Pod) (bool, error) {
			done, err := running(pod)
			if done || pod != nil && pod.Status.PodIP != "" {
				once.Do(func() { close(w.addressed) })
			}
			return done, err
		})
		w.ended <- err
	}()
	return w
}

func (w *restoredPodWatch) cannotStart(err error) error {
	return fmt.Errorf("pod %s cannot start on %s: %w", w.name, w.node, err)
}

// Rollback deletes the restored pod, unless it may hold messages nothing
// else has: a StatefulSet pod's copy (its source deleted) that replayed, or
// that answers with a state past the one it was restored with, moves back
// into the source's place instead. A bare pod's copy that consumed the
// primary queue while its source was stopped would be the only holder of
// those messages, so the rollback stops there, journal kept, rather than
// delete it; the engine never resumes a copy before its commit point.
func (restore) Rollback(ctx context.Context, m *Migration) error {
	if !m.state.TargetRequested {
		return nil
	}
	consumed, fromPrimary := "", false
	if m.state.Target != nil && (m.state.SourceDeleted || m.state.SourceHalted) {
		consumed, fromPrimary = m.targetConsumed(ctx)
	}
	switch {
	case consumed != "" && m.state.SourceDeleted:
		m.progress(report.Restore, consumed+": moving its state back into "+m.config.Pod+" on "+m.state.SourceNode)
		if err := m.moveBack(ctx, m.state.Target, m.state); err != nil {
			return err
		}
		m.state.SourceDeleted, m.state.SourceHalted = false, false
	case fromPrimary && m.config.Pod != m.config.TargetName:
		// What a bare pod's copy replayed its running source has too.
		return fmt.Errorf("%s while the source %s was stopped: it alone holds those messages, so it is kept; finish the migration forward by hand or move its state back", consumed, m.config.Pod)
	default:
		pod, err := m.deps.Client.CoreV1().Pods(m.config.Namespace).Get(ctx, m.config.TargetName, metav1.GetOptions{})
		if err == nil && pod.Labels[MigrationLabel] != m.config.ID {
			// The create failed on a pod of that name that is someone
			// else's (or the source itself): not ours to delete.
			m.progress(report.Restore, "pod "+m.config.TargetName+" is not this migration's: left alone")
		} else if err := m.deletePod(ctx, report.Restore, m.config.TargetName); err != nil {
			return err
		}
		if err := m.path().undoCreate(ctx, m, m.config.TargetNode); err != nil {
			return err
		}
	}
	m.state.Target, m.state.TargetRequested = nil, false
	return nil
}

// targetConsumed says why the restored copy may have applied messages since
// its restore ("" if it cannot have), and whether from its primary queue: it
// was told to replay, or it answers consuming, or with a state past the one
// it held with after the restore. A copy that does not answer consumes
// nothing: its broker connection died with the checkpoint, and only the
// engine tells it to consume again.
func (m *Migration) targetConsumed(ctx context.Context) (why string, fromPrimary bool) {
	if !m.config.Strategy.Contract() {
		return "", false // nothing selects the copy before the commit (revealLabels)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := m.deps.App.State(ctx, m.targetApp())
	held := m.state.TargetRestored
	switch {
	case err == nil && st.Mode == protocol.ModePrimary && !st.PendingRestore:
		return "the restored copy consumed its primary queue", true
	case !m.state.ReplayStarted.IsZero() || err == nil && st.Mode == protocol.ModeReplay:
		return "the restored copy replayed", false
	case err == nil && held.Process != "" && (st.LastSeq != held.LastSeq || st.Producer != held.Producer || st.Totals.Count != held.Totals.Count):
		return fmt.Sprintf("the restored copy applied messages since its restore (at %s, restored at %s)", st.Position(), held.Position()), true
	}
	return "", false
}

// explainRestoreFailure names the setting when node's runtime refused the
// restore itself (restore is opt-in on some runtimes) and preflight could
// not tell beforehand.
func (m *Migration) explainRestoreFailure(ctx context.Context, node string, err error) error {
	n, getErr := m.deps.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if getErr != nil {
		return err
	}
	if why, ok := runtimesupport.ExplainRestoreFailure(n.Status.NodeInfo.ContainerRuntimeVersion, err.Error()); ok {
		return fmt.Errorf("node %s: %s (%w)", node, why, err)
	}
	return err
}
