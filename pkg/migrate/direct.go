package migrate

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// A transfer without a registry (Direct) sends each checkpoint from the
// agent on the node it was taken on to the warm agent of the node it is
// restored on, which receives it over TLS pinned to its certificate and
// with a push token of its own. The target's receiver is started in
// setup; a StatefulSet pod's source node gets one too, since its
// rollback and a move back restore there; a recovery starts the receivers
// it needs, as the tokens never leave the process that made them.

// Receiver is one node's receiving agent, as the sending agent reaches it.
// The engine and check start theirs alike.
type Receiver struct {
	Address string // host:port
	Token   string
	Cert    string // SHA-256 of its TLS certificate, which the sender pins
}

// NewReceiver adds to opts what makes node's agent a receiver, staging
// what it receives for the kubectl-migrate runtime if stage, and returns
// the receiver it will be once its certificate is read (Started).
func NewReceiver(node *corev1.Node, opts agent.WarmOptions, stage bool) (agent.WarmOptions, Receiver, error) {
	address, err := DirectAddress(node)
	if err != nil {
		return opts, Receiver{}, err
	}
	token, err := NewDirectToken()
	if err != nil {
		return opts, Receiver{}, err
	}
	opts.DirectToken, opts.Stage = token, stage
	return opts, Receiver{Address: address, Token: token}, nil
}

// Started is r with the certificate of node's agent, started as r.
func (r Receiver) Started(ctx context.Context, packer Packer, node string) (Receiver, error) {
	cert, err := packer.DirectCert(ctx, node)
	if err != nil {
		return r, fmt.Errorf("ask node %s's agent for the certificate the checkpoint is sent to: %w", node, err)
	}
	r.Cert = cert
	return r, nil
}

// Request is how the checkpoint archive of container in pod of namespace
// is sent to r, tagged for the migration (stage) tag.
func (r Receiver) Request(archive, container, namespace, pod, tag string) agent.PackRequest {
	return agent.PackRequest{
		Archive: archive, Container: container,
		SendTo: r.Address, Token: r.Token, CertSHA256: r.Cert,
		Repository: namespace + "/" + pod, Tag: container + "-" + tag,
	}
}

// receivers are the migration's receiving agents by node; all stages share
// them.
type receivers struct {
	mu     sync.Mutex
	byNode map[string]Receiver
}

func (r *receivers) get(node string) (Receiver, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rcv, ok := r.byNode[node]
	return rcv, ok
}

func (r *receivers) set(node string, rcv Receiver) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byNode == nil {
		r.byNode = map[string]Receiver{}
	}
	r.byNode[node] = rcv
}

// nodeSet is a set of node names, safe for concurrent use.
type nodeSet struct {
	mu    sync.Mutex
	nodes map[string]bool
}

func (s *nodeSet) add(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes == nil {
		s.nodes = map[string]bool{}
	}
	s.nodes[node] = true
}

func (s *nodeSet) has(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes[node]
}

// agentOn makes sure this process has a warm agent on node, to pack, send
// or snapshot there: setup starts one on each node, a recovery starts with
// none. A StatefulSet pod's agents also receive when the transfer is
// direct, as setup starts them.
func (m *Migration) agentOn(ctx context.Context, node string) error {
	if m.sourceReceives() {
		_, err := m.receiverOn(ctx, node)
		return err
	}
	if _, ok := m.receivers.get(node); ok || m.warm.has(node) {
		return nil
	}
	n, err := m.deps.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", node, err)
	}
	m.progress(report.Image, "starting the agent on "+node)
	if err := m.deps.Packer.Warm(ctx, m.nextAgentPod(), node, m.agentOptions(n)); err != nil {
		return fmt.Errorf("node %s cannot run the agent: %w", node, err)
	}
	m.warm.add(node)
	return nil
}

// sourceReceives: the source node's agent is a receiver too. A StatefulSet
// pod's rollback, and its move back, restore it on the source node; lazy
// pages wait in the node's stage, which receivers mount, and go from there
// over a receiver's stream.
func (m *Migration) sourceReceives() bool {
	return m.path().receives() && (m.config.StatefulSet != "" || m.config.Pages == PagesLazy)
}

// DirectAddress is where the source's agent sends node's agent the
// checkpoint: the node's InternalIP, DirectReceivePort.
func DirectAddress(node *corev1.Node) (string, error) {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return net.JoinHostPort(a.Address, strconv.Itoa(agent.DirectReceivePort)), nil
		}
	}
	return "", fmt.Errorf("node %s has no InternalIP for the source's agent to send to; use a registry", node.Name)
}

// NewDirectToken is a direct-transfer agent's push token: random, from
// crypto/rand, as it authenticates the sender.
func NewDirectToken() (string, error) {
	token := make([]byte, 24)
	if _, err := rand.Read(token); err != nil {
		return "", err
	}
	return hex.EncodeToString(token), nil
}

// registerReceiver reads the certificate of node's receiver, started as
// rcv, and keeps the receiver with it for the transfers to node.
func (m *Migration) registerReceiver(ctx context.Context, node string, rcv Receiver) (Receiver, error) {
	rcv, err := rcv.Started(ctx, m.deps.Packer, node)
	if err != nil {
		return rcv, err
	}
	m.receivers.set(node, rcv)
	return rcv, nil
}

// receiverOn is node's receiver, started now if the migration has none
// there yet (a recovery, which starts with none).
func (m *Migration) receiverOn(ctx context.Context, node string) (Receiver, error) {
	if rcv, ok := m.receivers.get(node); ok {
		return rcv, nil
	}
	n, err := m.deps.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return Receiver{}, fmt.Errorf("get node %s: %w", node, err)
	}
	opts, rcv, err := m.path().receiver(n, m.agentOptions(n))
	if err != nil {
		return Receiver{}, err
	}
	if err := m.endLeftReceivers(ctx, node); err != nil {
		return Receiver{}, err
	}
	m.progress(report.Image, "starting the agent on "+node+" that receives the checkpoint")
	err = m.takeTurn(ctx, report.Image, node, func(int) error { return m.deps.Packer.Warm(ctx, m.nextAgentPod(), node, opts) })
	if err != nil {
		return Receiver{}, fmt.Errorf("node %s cannot run the agent that receives the checkpoint: %w", node, err)
	}
	return m.registerReceiver(ctx, node, rcv)
}

// takeTurn runs warm, which starts a receiver on node, once no other
// migration's receiver holds the node's receive ports: they are the node's
// own (host network), so migrations onto one node without a registry take
// turns (a drain's parallel moves, two users at once). Of two that started
// together, the kubelet refuses one; it waits for its turn again, and
// warms again (attempt counts the tries, for a fresh pod name). A
// receiver that found the ports held by one that has ended since (its pod
// gone before its process) tries again too, a few times.
func (m *Migration) takeTurn(ctx context.Context, phase report.PhaseName, node string, warm func(attempt int) error) error {
	heldByTheGone := 0
	for attempt := 0; ; attempt++ {
		holder, err := m.awaitFreeReceivePorts(ctx, phase, node)
		if err != nil {
			return fmt.Errorf("waiting for %s to end: %w", holder, err)
		}
		err = warm(attempt)
		if err == nil {
			return nil
		}
		if other, _ := m.otherReceiverOn(ctx, node); other != "" {
			continue
		}
		if !errors.Is(err, agent.ErrPortInUse) || heldByTheGone == portInUseRetries {
			return err
		}
		heldByTheGone++
		m.progress(phase, fmt.Sprintf("%s's receive port was still held by a receiver that has ended; trying again", node))
		select {
		case <-time.After(portInUseWait):
		case <-ctx.Done():
			return err
		}
	}
}

// A receiver's port held by no receiver that runs is tried again
// portInUseRetries times, portInUseWait apart: the process of one that
// ended lets go of it within a second or two.
const (
	portInUseRetries = 5
	portInUseWait    = time.Second
)

// awaitFreeReceivePorts waits, up to the phase's time limit, until no other
// migration's receiver runs on node; it names the one it waited for.
func (m *Migration) awaitFreeReceivePorts(ctx context.Context, phase report.PhaseName, node string) (string, error) {
	var waited string
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		other, err := m.otherReceiverOn(ctx, node)
		if err != nil {
			return false, err
		}
		if other != "" && waited == "" {
			m.progress(phase, fmt.Sprintf("agent %s of another migration receives on %s's ports; waiting for it to end", other, node))
		}
		waited = cmp.Or(other, waited)
		return other == "", nil
	})
	return waited, err
}

// otherReceiverOn names another migration's agent that holds node's
// receive ports, if one runs.
func (m *Migration) otherReceiverOn(ctx context.Context, node string) (string, error) {
	pods, err := m.receiversOn(ctx, node)
	for _, p := range pods {
		if p.Labels[MigrationLabel] != m.config.ID {
			return p.Name, err
		}
	}
	return "", err
}

// endLeftReceivers ends the receivers this migration has on node that
// this process did not start: a process that died left them holding the
// node's receive ports, with tokens no one has any more (a recovery's
// receiver could not start beside them).
func (m *Migration) endLeftReceivers(ctx context.Context, node string) error {
	pods, err := m.receiversOn(ctx, node)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if p.Labels[MigrationLabel] != m.config.ID {
			continue
		}
		m.progress(report.Image, "ending "+p.Name+", which a process that stopped left receiving on "+node)
		if err := m.deps.Packer.End(ctx, p.Name); err != nil {
			return fmt.Errorf("end the agent %s left on %s: %w", p.Name, node, err)
		}
	}
	return nil
}

// receiversOn are the agents that run on node and hold its receive ports.
func (m *Migration) receiversOn(ctx context.Context, node string) ([]corev1.Pod, error) {
	pods, err := m.deps.Client.CoreV1().Pods(m.config.AgentNamespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, fmt.Errorf("list the agents on %s: %w", node, err)
	}
	var receiving []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName != node || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // not every client honours the field selector
		}
		if agent.HoldsReceivePort(&p) {
			receiving = append(receiving, p)
		}
	}
	return receiving, nil
}
