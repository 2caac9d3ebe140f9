package migrate

import (
	"context"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// How a checkpoint travels and how the target restores it are chosen
// together, once, in preflight (ChooseRestore; a runtime restore takes the
// direct transfer), and journaled (Config.Transfer, State.RestoreVia).
// Every phase that depends on them asks the path they make, one type per
// way, so that a new way is one more type rather than an edit in every
// phase:
//
//   - registryPath: pushed to a registry, restored by the container runtime;
//   - agentPullPath: sent node to node, the target's agent serves it to its
//     container runtime, which restores it;
//   - stagedPath: sent node to node, staged by the target's agent for the
//     kubectl-migrate runtime, which restores it.
type checkpointPath interface {
	// check refuses, before anything changes, what this way cannot do.
	check(ctx context.Context, m *Migration) error
	// receiver makes node's agent, started with opts, one that receives
	// checkpoints from other agents, if this way sends node to node.
	receiver(node *corev1.Node, opts agent.WarmOptions) (agent.WarmOptions, Receiver, error)
	// receives: checkpoints go node to node, to a receiving agent.
	receives() bool
	// targetReady checks, once its agent runs, that the target node can
	// restore this way (puller names an agent pod for a probe pull).
	targetReady(ctx context.Context, m *Migration, puller string) error
	// request is how the agent on the checkpoint's node sends the archive
	// of container (packed) toward node.
	request(ctx context.Context, m *Migration, container, node string) (agent.PackRequest, error)
	// image is where the restore of container of pod (in c's namespace)
	// finds the checkpoint of the migration (stage) tag.
	image(c Config, pod, container, tag string) string
	// sent describes where a packed archive went (to node).
	sent(what, node string, res agent.PackResult) string
	// keepsArchives: the checkpoint archives stay on the source node until
	// the migration ends, all its rollback restores from.
	keepsArchives(c Config) bool
	// discard removes what packing left of the checkpoints outside the
	// source node, as the pack is undone.
	discard(ctx context.Context, m *Migration) error
	// release removes, as the migration ends, the checkpoints that outlive
	// the agents (unless --keep-images).
	release(ctx context.Context, m *Migration) error
	// createsEarly: the target is created before its checkpoint exists
	// (createsTargetEarly).
	createsEarly(statefulSet, target string) bool
	// beforeCreate and afterCreate surround the create of pod name on
	// node, restored this way; undoCreate undoes what they did outside the
	// pod once the pod is gone.
	beforeCreate(ctx context.Context, m *Migration, pod *corev1.Pod, node string) error
	afterCreate(ctx context.Context, m *Migration, created *corev1.Pod, node string) error
	undoCreate(ctx context.Context, m *Migration, node string) error
	// beforeRestoreOnSource readies the source node to restore a deleted
	// StatefulSet pod's source from the kept archives (keepsArchives).
	beforeRestoreOnSource(ctx context.Context, m *Migration) error
	// permissions are what the way needs beyond every migration's.
	permissions() []permission
	// Plan lines: the pack's and the restore's, and what cleanup deletes.
	describePack(s PlanStep) string
	describeRestore(s PlanStep) string
	leftAtCleanup(s PlanStep) []string
}

// pathFor is the way of a transfer and a restore as preflight chose them.
func pathFor(transfer Transfer, via Restore) checkpointPath {
	switch {
	case via == RestoreRuntime:
		return stagedPath{}
	case transfer == Direct:
		return agentPullPath{}
	}
	return registryPath{}
}

// path is the migration's way (pathFor), from its journaled choice.
func (m *Migration) path() checkpointPath { return pathFor(m.config.Transfer, m.state.RestoreVia) }

// path is the way of the step's configuration (Restore as preflight chose
// it).
func (s PlanStep) path() checkpointPath { return pathFor(s.Transfer, s.Restore) }

// directPath is what both ways that send node to node share.
type directPath struct{}

func (directPath) receives() bool { return true }

// A StatefulSet pod's checkpoint sent without a registry is all its
// rollback can restore the deleted source from.
func (directPath) keepsArchives(c Config) bool {
	return c.StatefulSet != "" && c.Pod == c.TargetName
}

// The checkpoint went to the target's agent, which goes with the migration.
func (directPath) release(context.Context, *Migration) error { return nil }

func (directPath) check(context.Context, *Migration) error { return nil } // the agents check theirs: startAgents

// send sends to node's receiver, from the source's agent, which must run
// too: after a crash none does until this starts it (a shadow's move back
// sends from the shadow's node).
func (directPath) send(ctx context.Context, m *Migration, container, node string) (agent.PackRequest, error) {
	to, err := m.receiverOn(ctx, node)
	if err != nil {
		return agent.PackRequest{}, err
	}
	if err := m.agentOn(ctx, m.state.SourceNode); err != nil {
		return agent.PackRequest{}, err
	}
	req := to.Request(m.state.Archives[container], container, m.config.Namespace, m.config.Pod, m.tag())
	req.KeepArchive = m.path().keepsArchives(m.config)
	return req, nil
}

func (directPath) leftAtCleanup(s PlanStep) []string {
	if s.inPlace() {
		return []string{"the checkpoint archives kept on " + s.SourceNode}
	}
	return nil
}

// criRestore is what both ways restored by the container runtime share.
type criRestore struct{}

func (criRestore) createsEarly(string, string) bool { return false }

func (criRestore) beforeRestoreOnSource(context.Context, *Migration) error { return nil }

// targetRuntimeRestores refuses a target whose container runtime's
// configuration does not let it restore (TargetRestores), before the
// checkpoint.
func (criRestore) targetRuntimeRestores(ctx context.Context, m *Migration) error {
	found, reported, err := TargetRestores(ctx, m.deps.Packer, m.nodes.target)
	if err == nil && !reported {
		m.progress(report.Setup, found)
	}
	return err
}
