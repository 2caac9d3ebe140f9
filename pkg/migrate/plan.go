package migrate

import (
	"fmt"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// PlanStep is what a phase needs to describe itself: its stage's
// configuration (Pod is the stage's source, TargetName its target) and
// where the stage starts.
type PlanStep struct {
	Config
	SourceNode string
	Containers []string
}

func (s PlanStep) queue() string  { return s.Broker.Queue }
func (s PlanStep) replay() string { return protocol.ReplayQueueName(s.Broker.Queue) }

// inPlace: a StatefulSet pod restored under its own name, whose source goes
// before its copy exists.
func (s PlanStep) inPlace() bool { return s.StatefulSet != "" && s.Pod == s.TargetName }

// Plan describes, step by step, what Run would do with cfg after its
// preflight, for source node sourceNode and the given containers: each
// phase of the list Run executes, in its stage, says what it will do.
func Plan(cfg Config, sourceNode string, containers []string) []string {
	cfg = stagedConfig(cfg)
	step := PlanStep{Config: cfg, SourceNode: sourceNode, Containers: containers}
	var steps []string
	for _, p := range Phases(cfg.Strategy, cfg.StatefulSet != "", cfg.Mode) {
		if line := p.Describe(step); line != "" {
			steps = append(steps, line)
		}
	}
	return steps
}

// stagedConfig is cfg as the first stage runs it: in shadow mode it restores
// the shadow.
func stagedConfig(cfg Config) Config {
	if cfg.StatefulSet != "" && cfg.Mode == Shadow {
		cfg.TargetName = ShadowName(cfg.Pod)
	}
	return cfg
}

func (preflight) Describe(PlanStep) string { return "" }

// early describes the target created before its checkpoint exists, if it
// is (createsTargetEarly).
func (s PlanStep) early() string {
	if !s.path().createsEarly(s.StatefulSet, s.TargetName) {
		return ""
	}
	return fmt.Sprintf("create pod %s on %s from its own images under RuntimeClass %s, whose runtime holds its start until the checkpoint is staged, and wait for its address; ", s.TargetName, s.TargetNode, ociruntime.HandlerName)
}

func (prepare) Describe(s PlanStep) string {
	return fmt.Sprintf("%sbind replay queue %s to exchange %s; mark %s's state", s.early(), s.replay(), s.Broker.Exchange, s.Pod)
}

func (stopSource) Describe(s PlanStep) string {
	return fmt.Sprintf("%sstop %s consuming %s", s.early(), s.Pod, s.queue())
}

func (isolateSource) Describe(s PlanStep) string {
	return fmt.Sprintf("%scut %s off the network (in its network namespace, by the agent on %s): from here its clients wait, and their connections are reset when its copy runs", s.early(), s.Pod, s.SourceNode)
}

func (checkpoint) Describe(s PlanStep) string {
	return fmt.Sprintf("checkpoint %s of %s on %s through the kubelet", strings.Join(s.Containers, ", "), s.Pod, s.SourceNode)
}

func (packImages) Describe(s PlanStep) string { return s.path().describePack(s) }

func (detach) Describe(s PlanStep) string {
	if !s.inPlace() {
		return fmt.Sprintf("delete statefulset %s orphaning its pods; delete the stopped %s", s.StatefulSet, s.TargetName)
	}
	stop := ""
	if s.Strategy == MS2M {
		stop = "stop " + s.Pod + "; "
	}
	return fmt.Sprintf("%sdelete statefulset %s orphaning its pods; delete pod %s", stop, s.StatefulSet, s.Pod)
}

func (restore) Describe(s PlanStep) string {
	if s.StatefulSet != "" && !isMemberName(s.StatefulSet, s.TargetName) {
		return fmt.Sprintf("restore shadow pod %s on %s (no member name, no pod-name label); it replays while %s serves", s.TargetName, s.TargetNode, s.Pod)
	}
	if s.early() != "" {
		return fmt.Sprintf("wait until pod %s has restored the staged checkpoints", s.TargetName)
	}
	return s.path().describeRestore(s)
}

func (adopt) Describe(s PlanStep) string {
	return fmt.Sprintf("re-create statefulset %s from its saved spec, adopting %s", s.StatefulSet, s.TargetName)
}

func (replay) Describe(s PlanStep) string {
	if s.inPlace() {
		return fmt.Sprintf("replay to %s's last message (limit %s)", s.Pod, s.ReplayTimeout)
	}
	return fmt.Sprintf("replay buffered messages until %s has caught up (limit %s)", s.TargetName, s.ReplayTimeout)
}

func (sw switchover) Describe(s PlanStep) string {
	switch {
	case s.Strategy == CheckpointRestore:
		return fmt.Sprintf("%s gets %s's labels: its Services and controller select it, and its clients reconnect to it", s.TargetName, s.Pod)
	case s.Strategy == StopAndCopy:
		return fmt.Sprintf("%s resumes %s", s.TargetName, s.queue())
	case s.inPlace():
		return fmt.Sprintf("%s takes over %s", s.TargetName, s.queue())
	}
	return fmt.Sprintf("stop %s; %s replays to its last message and takes over %s", s.Pod, s.TargetName, s.queue())
}

func (handover) Describe(s PlanStep) string {
	return (switchover{}).Describe(s) + " (the migration can still go back)"
}

func (cleanup) Describe(s PlanStep) string {
	var gone []string
	if !s.inPlace() {
		gone = append(gone, "pod "+s.Pod)
	}
	if s.Strategy == MS2M {
		gone = append(gone, "the replay queue")
	}
	gone = append(gone, s.path().leftAtCleanup(s)...)
	return "delete " + strings.Join(gone, " and ")
}

// Describe describes the phase in its stage: the final stage moves the
// shadow into the StatefulSet's name on the target node.
func (st inStage) Describe(s PlanStep) string {
	if st.onFinal {
		s.Pod, s.TargetName, s.SourceNode = s.TargetName, s.Pod, s.TargetNode
		s.Strategy = MS2M
	}
	line := st.Phase.Describe(s)
	if line == "" {
		return ""
	}
	return "[" + st.stage + "] " + line
}
