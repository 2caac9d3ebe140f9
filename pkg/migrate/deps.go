package migrate

import (
	"context"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/appctl"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m/protocol"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Kubelet is what a migration asks of nodes' kubelets.
type Kubelet interface {
	// Healthy returns nil if node's kubelet answers; a gateway error
	// (apierrors.APIStatus 502–504) if the API server answered that it
	// cannot reach it.
	Healthy(ctx context.Context, node string) error
}

// Packer runs the node-side work: turning checkpoint archives into pushed
// images, removing archives, pulling images.
type Packer interface {
	// Warm starts an agent on node that stays ready for the node's later
	// Pack and Remove calls; it fails if the node cannot run the agent.
	Warm(ctx context.Context, podName, node string, opts agent.WarmOptions) error
	// Release ends every agent of the migration, warm or left by a process
	// that died.
	Release(ctx context.Context) error
	// End ends one agent of the migration, by its pod's name, for good:
	// deleting its pod alone would leave its request, from which the
	// agents' controller could start it again.
	End(ctx context.Context, podName string) error
	// Checkpoint has node's warm agent (started with a RuntimeSocket)
	// checkpoint a container through the node's runtime and returns the
	// archive's path there.
	Checkpoint(ctx context.Context, node string, req agent.CheckpointRequest) (agent.CheckpointResult, error)
	// PagesResults says how the lazy restores of ids on node ended.
	PagesResults(ctx context.Context, node string, ids []ociruntime.Identity) ([]agent.PagesStatus, error)
	Pack(ctx context.Context, podName, node string, req agent.PackRequest) (agent.PackResult, error)
	Remove(ctx context.Context, podName, node string, archives []string) error
	// SnapshotVolumes has node's warm agent snapshot a pod's emptyDir
	// volumes into req.Archive, or only measure them.
	SnapshotVolumes(ctx context.Context, node string, req agent.SnapshotRequest) (agent.SnapshotResult, error)
	// Prepull makes node pull images (the base images restore builds on).
	Prepull(ctx context.Context, podName, node string, images []string) error
	// Runtime is what node's runtime says of itself, asked through node's
	// warm agent (started with a RuntimeSocket).
	Runtime(ctx context.Context, node string) (agent.RuntimeInfo, error)
	// Expect has node's receiving agent (started with WarmOptions.Stage)
	// mark the checkpoints of ids as on their way (agent.ExpectedPath).
	Expect(ctx context.Context, node string, ids []ociruntime.Identity) error
	// Bind has node's receiving agent give the checkpoints staged for ids'
	// names before their pod existed to the pod of ids' UID
	// (agent.Launcher.Bind).
	Bind(ctx context.Context, node string, ids []ociruntime.Identity) error
	// DirectCert is the fingerprint of the certificate node's warm
	// direct-transfer agent receives with (started with a DirectToken).
	DirectCert(ctx context.Context, node string) (string, error)
	// StopPod stops and removes the sandboxes of the pod with uid through
	// node's runtime (its warm agent), for when node's kubelet is gone.
	StopPod(ctx context.Context, node, uid string) (agent.StopPodResult, error)
	// Fence has node's warm agent (started with WarmOptions.Fence) cut the
	// pod with uid off the network, or with lift let it back on.
	Fence(ctx context.Context, node, uid string, lift bool) (agent.FenceResult, error)
}

// Broker manages queues.
type Broker interface {
	CheckExchange(ctx context.Context, exchange string) error
	BindReplayQueue(ctx context.Context, exchange, queue string) error
	BindProbeQueue(ctx context.Context, exchange, queue string, expires time.Duration) error
	DeclareQueue(ctx context.Context, queue string) error
	PublishMarker(ctx context.Context, exchange, id string) error
	QueueDepth(ctx context.Context, queue string) (int, error)
	DeleteQueue(ctx context.Context, queue string) error
	Close() error
}

// App drives MS2M application instances.
type App interface {
	State(ctx context.Context, t appctl.Target) (protocol.State, error)
	Control(ctx context.Context, t appctl.Target, msg protocol.Control) (protocol.State, error)
	AppliedAfter(ctx context.Context, t appctl.Target, p protocol.Position) (protocol.Applied, error)
}

// Registry checks and deletes images.
type Registry interface {
	CheckPush(ctx context.Context, repo string) error
	Delete(ctx context.Context, ref string) error
}

// RecordStore keeps migration records.
type RecordStore interface {
	Save(ctx context.Context, r *report.Record) error
}

// Deps are the outside systems a migration talks to.
type Deps struct {
	Client  kubernetes.Interface
	Kubelet Kubelet
	Packer  Packer
	// DialBroker connects to the broker; called once, in preflight (or by
	// recovery).
	DialBroker func(ctx context.Context, url string) (Broker, error)
	App        App
	Registry   Registry
	Records    RecordStore
	// JournalKey returns the key journals are signed with (JournalKeyIn
	// the agents' namespace; for a recovery, the one its operator names,
	// never the journal's).
	JournalKey func(ctx context.Context) ([]byte, error)
}

// Hooks let the caller show progress; any of them may be nil.
type Hooks struct {
	// PhaseStarted and PhaseFinished get the phase's name and stage (a
	// StatefulSet pod's shadow mode runs phases once per stage).
	PhaseStarted  func(p report.PhaseTiming)
	PhaseFinished func(p report.PhaseTiming, took time.Duration, err error)
	// Progress reports a step inside a phase, e.g. replay progress.
	Progress func(name report.PhaseName, message string)
	// RollbackStarted is called once before the rollbacks run.
	RollbackStarted func(cause error)
	// LockLost is called, from another goroutine, when the migration can
	// no longer be sure it holds its lock: it has stopped changing the
	// cluster and leaves its journal to recovery (err wraps lease.ErrLost).
	LockLost func(err error)
}
