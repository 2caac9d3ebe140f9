// Package check proves, in seconds and without a user's workload, that a
// migration between two nodes can work: a canary (the agent image in canary
// mode, holding a TCP connection) is checkpointed on one node, pushed, and
// restored on the other as the same process. Each link a migration relies
// on is reported with what was seen and, when it fails, the remedy; the
// canary, its image and archive and the agents are removed again.
//
// The links are the engine's own steps where a migration has them: the
// node pair's checks and the choice of restore path (migrate.NodePair,
// ChooseRestore, TargetRestores), the receiving agent (migrate.Receiver),
// the kubelet's checkpoint and its explained failures, the agents' pack and
// the restored pod (migrate.RestoredPod). What check adds is the canary, a
// workload of its own, so that it needs none of the user's.
package check

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
)

// Config is what to check.
type Config struct {
	ID        string // names the canary and its image
	Namespace string
	From, To  string // nodes
	// ImageRepository, RegistrySecret and InsecureRegistry are the
	// registry settings the migrations will use.
	ImageRepository  string
	RegistrySecret   string
	InsecureRegistry bool
	AgentImage       string
	AgentNamespace   string // where the agents run ("" for agent.DefaultNamespace)
	// Transfer is how the checkpoint travels, as the migrations will send
	// it: through ImageRepository, or node to node (migrate.Direct, also
	// whenever the kubectl-migrate runtime restores).
	Transfer migrate.Transfer
	// Restore is the restore path the migrations will ask for ("" or auto:
	// as a migration picks it).
	Restore migrate.Restore
}

// Status is a link's outcome.
type Status string

const (
	OK      Status = "ok"
	Failed  Status = "failed"
	Skipped Status = "skipped" // an earlier link failed
)

// Link is one thing a migration between the nodes relies on.
type Link struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail is what was seen; Remedy, for a failed link, what to change.
	Detail string `json:"detail,omitempty"`
	Remedy string `json:"remedy,omitempty"`
	Millis int64  `json:"millis"`
}

// Result is the whole check.
type Result struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Links []Link `json:"links"`
	// Image is the canary's checkpoint image, deleted again by cleanup.
	Image  string `json:"image,omitempty"`
	Millis int64  `json:"millis"`
}

// OK reports whether every link held.
func (r Result) OK() bool {
	for _, l := range r.Links {
		if l.Status != OK {
			return false
		}
	}
	return len(r.Links) > 0
}

// Link names, in the order they are checked.
const (
	LinkPermissions    = "permissions"
	LinkNodes          = "nodes"
	LinkAgents         = "agent image"
	LinkRuntimeRestore = "runtime restore"
	LinkCanary         = "canary"
	LinkCheckpoint     = "checkpoint"
	LinkPush           = "transfer"
	LinkPull           = "node pull"
	LinkRestore        = "restore"
	LinkSameProcess    = "same process"
	LinkCleanup        = "cleanup"
)

// fail is a failed link's finding and remedy, as the engine's own checks
// refuse.
func fail(remedy, format string, args ...any) error {
	return &migrate.Refusal{Finding: fmt.Sprintf(format, args...), Remedy: remedy}
}

// checker runs the links in order; after a failure the rest are skipped.
type checker struct {
	cfg    Config
	deps   migrate.Deps
	result Result
	failed bool
	hooks  Hooks

	agentPods      int
	canary         *corev1.Pod // running on From
	archive        string
	image          string
	restored       string // pod name on To
	restoring      bool   // its create was asked for
	before         protocol.State
	source, target *corev1.Node
	// viaRuntime: To's runtime does not restore, the kubectl-migrate
	// runtime does; the checkpoint is sent to To's agent (receiver), which
	// stages it there (staged): no image.
	viaRuntime bool
	receiver   migrate.Receiver
	staged     string
	// direct: the checkpoint goes to To's agent (always with viaRuntime);
	// without the runtime, To's runtime pulls it from that agent with
	// pullSecret.
	direct     bool
	pullSecret string
}

// Hooks show a check's progress; either may be nil.
type Hooks struct {
	LinkStarted func(name string) // a link that runs (not a skipped one)
	LinkEnded   func(Link)
}

// Run checks cfg's two nodes with deps (a migration's: client, kubelet,
// agents, application and registry clients), telling hooks of each link.
// It cleans up whatever it created, whatever happens.
func Run(ctx context.Context, cfg Config, deps migrate.Deps, hooks Hooks) Result {
	c := &checker{cfg: cfg, deps: deps, result: Result{From: cfg.From, To: cfg.To}, hooks: hooks}
	c.restored = "kubectl-migrate-canary-" + cfg.ID + "-restored"
	start := time.Now()
	c.link(LinkPermissions, func() (string, error) { return c.permissions(ctx) })
	c.link(LinkNodes, func() (string, error) { return c.nodes(ctx) })
	c.link(LinkAgents, func() (string, error) { return c.agents(ctx) })
	c.link(LinkRuntimeRestore, func() (string, error) { return c.runtimeRestore(ctx) })
	c.link(LinkCanary, func() (string, error) { return c.startCanary(ctx) })
	c.link(LinkCheckpoint, func() (string, error) { return c.checkpoint(ctx) })
	c.link(LinkPush, func() (string, error) { return c.push(ctx) })
	restored := make(chan restoreOutcome, 1)
	c.link(LinkPull, func() (string, error) { return c.pull(ctx, restored) })
	c.link(LinkRestore, func() (string, error) { out := <-restored; return out.detail, out.err })
	c.link(LinkSameProcess, func() (string, error) { return c.sameProcess(ctx) })
	c.failed = false // cleanup runs whatever happened before
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	c.link(LinkCleanup, func() (string, error) { return c.cleanup(cleanupCtx) })
	c.result.Millis = time.Since(start).Milliseconds()
	return c.result
}

func (c *checker) link(name string, fn func() (string, error)) {
	l := Link{Name: name, Status: Skipped}
	if !c.failed {
		if c.hooks.LinkStarted != nil {
			c.hooks.LinkStarted(name)
		}
		start := time.Now()
		detail, err := fn()
		l.Millis = time.Since(start).Milliseconds()
		l.Status, l.Detail = OK, detail
		if err != nil {
			l.Status, l.Detail = Failed, err.Error()
			var r *migrate.Refusal
			if errors.As(err, &r) {
				l.Detail, l.Remedy = r.Finding, r.Remedy
			}
			c.failed = true
		}
	}
	c.result.Links = append(c.result.Links, l)
	if c.hooks.LinkEnded != nil {
		c.hooks.LinkEnded(l)
	}
}

func (c *checker) nextPod() string {
	c.agentPods++
	return fmt.Sprintf("kubectl-migrate-check-%s-%c", c.cfg.ID, 'a'+c.agentPods-1)
}

func (c *checker) permissions(ctx context.Context) (string, error) {
	mc := migrate.Config{Namespace: c.cfg.Namespace, AgentNamespace: c.cfg.AgentNamespace, RegistrySecret: c.cfg.RegistrySecret}
	missing, err := migrate.MissingPermissions(ctx, c.deps.Client, mc)
	if err != nil {
		return "", err
	}
	if len(missing) > 0 {
		return "", fail("grant them with RBAC: docs/rbac.yaml has them all", "missing: %s", strings.Join(missing, "; "))
	}
	if mc.Agents() != c.cfg.Namespace {
		if err := agent.CheckNamespace(ctx, c.deps.Client, mc.Agents()); err != nil {
			return "", fail("have an administrator delete it and apply docs/rbac.yaml, or pass --agent-namespace", "%v", err)
		}
	}
	if err := agent.CheckController(ctx, c.deps.Client, mc.Agents(), time.Now()); err != nil {
		return "", fail("have an administrator run kubectl migrate node-setup --agents-only", "%v", err)
	}
	return fmt.Sprintf("pods, pods/proxy, configmaps in %s; agents in %s", c.cfg.Namespace, mc.Agents()), nil
}

// nodes makes the engine's checks of the node pair and picks the restore
// path as a migration with --restore auto would.
func (c *checker) nodes(ctx context.Context) (string, error) {
	source, target, err := migrate.NodePair(ctx, c.deps.Client, c.cfg.From, c.cfg.To)
	if err != nil {
		return "", err
	}
	via, note, err := migrate.ChooseRestore(migrate.RestoreNeeds{Want: c.cfg.Restore, Target: target})
	if err != nil {
		return "", err
	}
	c.source, c.target, c.viaRuntime = source, target, via == migrate.RestoreRuntime
	c.direct = c.viaRuntime || c.cfg.Transfer == migrate.Direct
	seen := fmt.Sprintf("%s %s, %s %s", source.Name, source.Status.NodeInfo.ContainerRuntimeVersion, target.Name, target.Status.NodeInfo.ContainerRuntimeVersion)
	if note != "" {
		seen += "; " + note
	}
	return seen, nil
}

func (c *checker) agents(ctx context.Context) (string, error) {
	// Both at once: each takes seconds to start.
	targetOpts, err := c.targetAgent()
	if err != nil {
		return "", err
	}
	var g errgroup.Group
	for _, n := range []struct {
		node, pod string
		opts      agent.WarmOptions
	}{
		// The source's agent checkpoints through its node's runtime.
		{c.cfg.From, c.nextPod(), agent.WarmOptions{RuntimeSocket: agent.RuntimeSocket(c.source.Status.NodeInfo.ContainerRuntimeVersion)}},
		{c.cfg.To, c.nextPod(), targetOpts},
	} {
		g.Go(func() error {
			if err := c.deps.Packer.Warm(ctx, n.pod, n.node, n.opts); err != nil {
				return fail(agentRemedy(err, cmp.Or(c.cfg.AgentNamespace, agent.DefaultNamespace)), "node %s cannot run %s: %v", n.node, c.cfg.AgentImage, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return "", err
	}
	if !c.direct {
		return c.cfg.AgentImage + " runs on both nodes", nil
	}
	if c.receiver, err = c.receiver.Started(ctx, c.deps.Packer, c.cfg.To); err != nil {
		return "", err
	}
	if !c.viaRuntime {
		// As a migration's setup proves it: the node's runtime must pull
		// from its agent, over plain HTTP on localhost.
		probe := agent.DirectRegistry() + "/" + agent.ProbeImage
		if err := c.deps.Packer.Prepull(ctx, c.nextPod(), c.cfg.To, []string{probe}); err != nil {
			return "", fail(fmt.Sprintf("let it pull from there over plain HTTP (CRI-O: insecure_registries in [crio.image]; containerd: a hosts.toml for %s in its config_path), or pass --registry", agent.DirectRegistry()),
				"node %s's runtime cannot pull from its agent at %s: %v", c.cfg.To, agent.DirectRegistry(), err)
		}
	}
	return c.cfg.AgentImage + " runs on both nodes; the one on " + c.cfg.To + " receives the checkpoint over TLS", nil
}

// targetAgent is how To's agent runs: with the kubectl-migrate runtime, it
// receives the checkpoint and stages it.
func (c *checker) targetAgent() (agent.WarmOptions, error) {
	opts := agent.WarmOptions{RuntimeSocket: agent.RuntimeSocket(c.target.Status.NodeInfo.ContainerRuntimeVersion)}
	if !c.direct {
		return opts, nil
	}
	opts, receiver, err := migrate.NewReceiver(c.target, opts, c.viaRuntime)
	c.receiver = receiver
	return opts, err
}

// agentRemedy tells a Pod Security refusal from an image the node cannot
// pull or run.
func agentRemedy(err error, namespace string) string {
	if strings.Contains(err.Error(), "violates PodSecurity") {
		return "the agent needs root, the kubelet's checkpoint directory and the runtime's socket, in a namespace of its own whose Pod Security level is privileged: label it with kubectl label namespace " + namespace + " pod-security.kubernetes.io/enforce=privileged (docs/rbac.yaml creates it so), or pass --agent-namespace"
	}
	return "pass --agent-image with an image both nodes can pull and run"
}

func (c *checker) runtimeRestore(ctx context.Context) (string, error) {
	if c.viaRuntime {
		return fmt.Sprintf("%s on %s does not restore; the kubectl-migrate runtime does (installed by node-setup)", c.target.Status.NodeInfo.ContainerRuntimeVersion, c.cfg.To), nil
	}
	found, _, err := migrate.TargetRestores(ctx, c.deps.Packer, c.target)
	return found, err
}

func (c *checker) canaryApp(pod string) appctl.Target {
	return appctl.Target{Namespace: c.cfg.Namespace, Pod: pod, Port: agent.CanaryPort}
}

func (c *checker) startCanary(ctx context.Context) (string, error) {
	pod := agent.CanaryPod(c.cfg.Namespace, "kubectl-migrate-canary-"+c.cfg.ID, c.cfg.From, c.cfg.AgentImage, c.labels())
	if _, err := c.deps.Client.CoreV1().Pods(c.cfg.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return "", fail(agentRemedy(err, c.cfg.Namespace), "create the canary on %s: %v", c.cfg.From, err)
	}
	running, err := kube.WaitForPod(ctx, c.deps.Client, c.cfg.Namespace, pod.Name, kube.ContainersRunning("", []string{"canary"}))
	if running != nil {
		c.canary = running
	} else {
		c.canary = pod // for cleanup
	}
	if err != nil {
		return "", fmt.Errorf("the canary on %s did not run: %w", c.cfg.From, err)
	}
	// It answers once it pinged over its connection: that is the state
	// the checkpoint must carry.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		st, err := c.deps.App.State(ctx, c.canaryApp(pod.Name))
		c.before = st
		return err == nil && st.LastSeq > 0, nil
	})
	if err != nil {
		return "", fmt.Errorf("the canary on %s runs but does not answer through the API server's pod proxy on port %d: %w", c.cfg.From, agent.CanaryPort, err)
	}
	return fmt.Sprintf("%s on %s, process %s, holding a TCP connection", pod.Name, c.cfg.From, c.before.Process), nil
}

func (c *checker) labels() map[string]string {
	return map[string]string{"app.kubernetes.io/name": "kubectl-migrate-check", migrate.MigrationLabel: MigrationID(c.cfg.ID)}
}

// MigrationID is what check id labels its pods with (migrate.MigrationLabel):
// the agents the caller's deps start must carry it, so cleanup finds them.
func MigrationID(id string) string { return "check-" + id }

func (c *checker) checkpoint(ctx context.Context) (string, error) {
	res, err := c.deps.Packer.Checkpoint(ctx, c.cfg.From, agent.CheckpointRequest{Namespace: c.cfg.Namespace, Pod: c.canary.Name, UID: string(c.canary.UID), Container: "canary", TimeoutSeconds: 60})
	path := res.Archive
	var explained *agent.CheckpointError
	switch {
	case errors.As(err, &explained):
		return "", fail(explained.Remedy, "%s", explained.Finding)
	case err != nil:
		return "", fail(agent.CheckpointRemedy(err), "%v", err)
	}
	c.archive = path
	st, err := c.deps.App.State(ctx, c.canaryApp(c.canary.Name))
	if err == nil {
		c.before = st // what the restored copy must go on from
	}
	return fmt.Sprintf("the runtime's checkpoint (as the kubelet's API calls it) and CRIU on %s: %s", c.cfg.From, path), nil
}

// cleanup removes the canaries, the checkpoint image, a left archive and
// the agents, and says which it removed (none, when the check stopped
// before it created anything).
func (c *checker) cleanup(ctx context.Context) (string, error) {
	var errs, left, removed []string
	remove := func(what string, err error) {
		if err != nil {
			errs, left = append(errs, err.Error()), append(left, what)
		} else {
			removed = append(removed, what)
		}
	}
	restored := ""
	if c.restoring {
		restored = c.restored
	}
	for _, name := range []string{restored, canaryName(c.canary)} {
		if name != "" {
			remove("pod "+name, kube.DeleteAndWait(ctx, c.deps.Client, c.cfg.Namespace, name, ptr.To[int64](0)))
		}
	}
	if c.archive != "" {
		remove(c.archive+" on "+c.cfg.From, c.deps.Packer.Remove(ctx, c.nextPod(), c.cfg.From, []string{c.archive}))
	}
	if c.staged != "" {
		// Restored, it is gone; a restore that never came leaves it.
		remove(c.staged+" on "+c.cfg.To, c.deps.Packer.Remove(ctx, c.nextPod(), c.cfg.To, []string{c.staged}))
	}
	if c.image != "" && !c.direct { // To's agent holds a direct transfer's image, and goes below
		remove("image "+c.image, c.deps.Registry.Delete(ctx, c.image))
	}
	if c.pullSecret != "" {
		remove("secret "+c.pullSecret, kube.DeleteSecret(ctx, c.deps.Client, c.cfg.Namespace, c.pullSecret))
	}
	// Only agents it asked for can be left: a check stopped before (say, by
	// an API server it cannot reach) names none.
	if c.agentPods > 0 {
		remove("agent pods labelled "+migrate.MigrationLabel+"="+MigrationID(c.cfg.ID), c.deps.Packer.Release(ctx))
	}
	if len(left) > 0 {
		return "", fail("remove them by hand: "+strings.Join(left, ", "), "left behind: %s", strings.Join(errs, "; "))
	}
	if len(removed) == 0 {
		return "nothing to remove: the check created nothing", nil
	}
	return "removed " + strings.Join(removed, ", "), nil
}

func canaryName(p *corev1.Pod) string {
	if p == nil {
		return ""
	}
	return p.Name
}
