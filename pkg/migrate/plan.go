package migrate

import (
	"fmt"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
)

// Plan describes, step by step, what Run would do with cfg after its
// preflight, for source node sourceNode and the given containers.
func Plan(cfg Config, sourceNode string, containers []string) []string {
	var steps []string
	add := func(format string, args ...any) { steps = append(steps, fmt.Sprintf(format, args...)) }
	queue, replay := cfg.Broker.Queue, ms2m.ReplayQueueName(cfg.Broker.Queue)
	ctrs := strings.Join(containers, ", ")
	images := func(pod string) string { return cfg.CheckpointImageOf(pod, "<container>", cfg.ID) }
	transfer := func(pod, node string) {
		if cfg.Transfer == Direct {
			add("stream the checkpoint archives from the agent on %s to the agent on %s (no registry), which serves them to its node as %s", node, cfg.TargetNode, images(pod))
			return
		}
		add("pack and push %s from the agent on %s (%s), started in preflight", images(pod), node, cfg.AgentImage)
	}
	ms2mInto := func(from, node string) {
		add("bind replay queue %s to exchange %s; mark %s's state", replay, cfg.Broker.Exchange, from)
		add("checkpoint %s of %s on %s through the kubelet", ctrs, from, node)
		transfer(from, node)
	}
	switch {
	case cfg.StatefulSet != "" && cfg.Mode == Shadow:
		shadow := ShadowName(cfg.Pod)
		ms2mInto(cfg.Pod, sourceNode)
		add("restore shadow pod %s on %s (no member name, no pod-name label); it replays while %s serves", shadow, cfg.TargetNode, cfg.Pod)
		add("stop %s; %s replays to its last message and takes over %s", cfg.Pod, shadow, queue)
		ms2mInto(shadow, cfg.TargetNode)
		add("delete statefulset %s orphaning its pods; delete the stopped %s", cfg.StatefulSet, cfg.Pod)
		add("restore pod %s on %s; re-create statefulset %s from its saved spec, adopting it", cfg.Pod, cfg.TargetNode, cfg.StatefulSet)
		add("replay until caught up (limit %s); stop %s; %s takes over %s", cfg.ReplayTimeout, shadow, cfg.Pod, queue)
		add("delete pod %s and the replay queue", shadow)
	case cfg.StatefulSet != "":
		if cfg.Strategy == MS2M {
			ms2mInto(cfg.Pod, sourceNode)
		} else {
			add("stop %s consuming %s", cfg.Pod, queue)
			add("checkpoint %s of %s on %s through the kubelet", ctrs, cfg.Pod, sourceNode)
			transfer(cfg.Pod, sourceNode)
		}
		stop := ""
		if cfg.Strategy == MS2M {
			stop = "stop " + cfg.Pod + "; "
		}
		add("%sdelete statefulset %s orphaning its pods; delete pod %s", stop, cfg.StatefulSet, cfg.Pod)
		add("restore pod %s on %s; re-create statefulset %s from its saved spec, adopting it", cfg.Pod, cfg.TargetNode, cfg.StatefulSet)
		if cfg.Strategy == MS2M {
			add("replay to the source's last message (limit %s) and take over %s; delete the replay queue", cfg.ReplayTimeout, queue)
		} else {
			add("resume %s", queue)
		}
	case cfg.Strategy == MS2M:
		ms2mInto(cfg.Pod, sourceNode)
		add("restore pod %s on %s", cfg.TargetName, cfg.TargetNode)
		add("replay buffered messages until the target has caught up (limit %s)", cfg.ReplayTimeout)
		add("stop the source; the target replays to its last message and takes over %s", queue)
		add("delete pod %s and the replay queue", cfg.Pod)
	default:
		add("stop the source consuming %s", queue)
		add("checkpoint %s of %s on %s through the kubelet", ctrs, cfg.Pod, sourceNode)
		transfer(cfg.Pod, sourceNode)
		add("restore pod %s on %s; it resumes %s", cfg.TargetName, cfg.TargetNode, queue)
		add("delete pod %s", cfg.Pod)
	}
	return steps
}
