package migrate

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// setup readies what the later phases use, before anything of the workload
// changes: the lock, the arrival probe, and the agents on both nodes with
// the checks only they can make and the base images the target's restore
// builds on. None of it needs recovery (leases a later migration sees
// abandoned, a probe queue that expires, agents that idle out), so it
// journals nothing; its rollback removes the probe and the agents at once.
// The leases are the whole migration's: whoever ends it gives them up.
type setup struct{}

func (setup) Name() report.PhaseName { return report.Setup }

func (setup) traits() traits { return traits{unjournaled: true} }

func (setup) Describe(PlanStep) string { return "" }

func (setup) Run(ctx context.Context, m *Migration) error {
	if !m.config.DryRun { // a dry run changes nothing that needs a lock
		if err := m.acquireLeases(ctx, false); err != nil {
			return err
		}
		m.progress(report.Setup, "lock taken")
	}
	m.startLambdaProbe(ctx)
	if err := m.startAgents(ctx); err != nil {
		return err
	}
	m.progress(report.Setup, "agents ok")
	if !m.config.DryRun {
		m.expect(ctx)
	}
	return nil
}

func (setup) Rollback(ctx context.Context, m *Migration) error {
	m.releaseAgents(ctx)
	if err := m.dropProbe(ctx); err != nil {
		m.progress(report.Setup, "probe queue not deleted (it expires by itself): "+err.Error())
	}
	return nil
}

// expect predicts the migration from what setup measured, keeps the
// prediction in the record and says it; a prediction that fails is only
// said.
func (m *Migration) expect(ctx context.Context) {
	p, err := m.predict(ctx, cmp.Or(m.config.PredictWindow, lambdaMinWindow))
	if err != nil {
		m.progress(report.Setup, "no prediction: "+err.Error())
		return
	}
	if m.Record.Prediction = p; p != nil && p.Freeze != nil {
		m.progress(report.Setup, "expected: "+p.Freeze.Summary())
		return
	}
	if p == nil || p.TotalMillis == 0 {
		return
	}
	msg := fmt.Sprintf("expected: total ≈ %s", time.Duration(p.TotalMillis)*time.Millisecond)
	if p.ReplayMillis > 0 {
		msg += fmt.Sprintf(", replay ≈ %s", time.Duration(p.ReplayMillis)*time.Millisecond)
	}
	m.progress(report.Setup, msg+fmt.Sprintf(" (λ %.1f/s, μ %.1f/s)", p.Lambda, p.Mu))
}

// agentOptions is how a migration's agent runs on node: reaching the
// node's runtime (to checkpoint there, and to pull without a pod), and with
// the kubelet's pods directory if volumes are carried (to snapshot them).
// Any node's agent may checkpoint: a rollback or a move back checkpoints a
// copy on the target.
// The source node's agent may also isolate a source without the MS2M
// contract (isolateSource).
func (m *Migration) agentOptions(node *corev1.Node) agent.WarmOptions {
	return agent.WarmOptions{
		RuntimeSocket: agent.RuntimeSocket(node.Status.NodeInfo.ContainerRuntimeVersion),
		Volumes:       len(m.carriedVolumes()) > 0,
		Fence:         !m.config.Strategy.Contract() && node.Name == m.state.SourceNode,
	}
}

// startAgents starts the warm agents on both nodes, proving that their
// image can be pulled and is allowed to run there (packing and removing the
// checkpoint archives need it); they stay ready for the steps that need
// them. Meanwhile the target pulls the base images its restore builds on, so
// that restore does not wait for them.
func (m *Migration) startAgents(ctx context.Context) error {
	bases := m.baseImages()
	sourceAgent, targetAgent, puller, probePuller := m.nextAgentPod(), m.nextAgentPod(), m.nextAgentPod(), m.nextAgentPod()
	// With emptyDir volumes to carry, either node's agent may snapshot
	// them (shadow mode's final stage, and a move back, start on the
	// target).
	sourceOpts, targetOpts := m.agentOptions(m.nodes.source), m.agentOptions(m.nodes.target)
	path := m.path()
	var toSource, toTarget Receiver
	var err error
	if targetOpts, toTarget, err = path.receiver(m.nodes.target, targetOpts); err != nil {
		return err
	}
	if m.sourceReceives() {
		if sourceOpts, toSource, err = path.receiver(m.nodes.source, sourceOpts); err != nil {
			return err
		}
	}
	warm := func(pod, node string, opts agent.WarmOptions) error {
		start := func() error { return m.deps.Packer.Warm(ctx, pod, node, opts) }
		if opts.DirectToken != "" {
			start = func() error {
				return m.takeTurn(ctx, report.Setup, node, func(attempt int) error {
					name := pod
					if attempt > 0 {
						name = fmt.Sprintf("%s%d", pod, attempt+1) // the refused one keeps its name until released
					}
					return m.deps.Packer.Warm(ctx, name, node, opts)
				})
			}
		}
		err := start()
		switch {
		case err == nil:
			m.warm.add(node)
			return nil
		case opts.DirectToken != "":
			return fmt.Errorf("node %s cannot run the agent that receives the checkpoint (on the node's network, ports %d and %d): %w; free the ports, or use a registry", node, agent.DirectPort, agent.DirectReceivePort, err)
		case strings.Contains(err.Error(), "--agent-image"):
			return fmt.Errorf("node %s cannot run the agent image %s: %w", node, m.config.AgentImage, err) // the agent named the remedy
		}
		return fmt.Errorf("node %s cannot run the agent image %s: %w; pass --agent-image with an image the nodes can pull and run", node, m.config.AgentImage, err)
	}
	start := time.Now()
	var sourceReady, targetReady, pullStart, pulled time.Time // each goroutine writes its own
	warmSource := func() error {
		err := warm(sourceAgent, m.state.SourceNode, sourceOpts)
		sourceReady = time.Now()
		return err
	}
	warmTarget := func() error {
		err := warm(targetAgent, m.config.TargetNode, targetOpts)
		targetReady = time.Now()
		return err
	}
	// Receivers on both nodes start one after the other, in the order of
	// the nodes' names (a lock order): two migrations that each need both
	// nodes' receive ports, starting them side by side, could each take one
	// node's and wait for the other's until the phase's time limit.
	if sourceOpts.DirectToken != "" && targetOpts.DirectToken != "" {
		first, second := warmSource, warmTarget
		if m.config.TargetNode < m.state.SourceNode {
			first, second = second, first
		}
		if err := first(); err != nil {
			return err
		}
		if err := second(); err != nil {
			return err
		}
		warmSource, warmTarget = func() error { return nil }, func() error { return nil }
	}
	var g errgroup.Group
	g.Go(func() error {
		if err := warmSource(); err != nil {
			return err
		}
		if sourceOpts.DirectToken != "" {
			if _, err := m.registerReceiver(ctx, m.state.SourceNode, toSource); err != nil {
				return err
			}
		}
		return m.checkVolumeSize(ctx)
	})
	g.Go(func() error {
		if err := warmTarget(); err != nil {
			return err
		}
		if targetOpts.DirectToken != "" {
			if _, err := m.registerReceiver(ctx, m.config.TargetNode, toTarget); err != nil {
				return err
			}
		}
		if err := path.targetReady(ctx, m, probePuller); err != nil {
			return err
		}
		// Through the warm agent: images the node has are found at once.
		pullStart = time.Now()
		if err := m.deps.Packer.Prepull(ctx, puller, m.config.TargetNode, bases); err != nil {
			return fmt.Errorf("node %s cannot pull the images %v its restore needs: %w", m.config.TargetNode, bases, err)
		}
		pulled = time.Now()
		return nil
	})
	err = g.Wait()
	if err == nil {
		m.stepTook(report.AgentsReady, "", start, max(sourceReady.Sub(start), targetReady.Sub(start)), 0)
		m.stepTook(report.BasePull, "", pullStart, pulled.Sub(pullStart), 0)
	}
	return err
}
