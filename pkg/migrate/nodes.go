package migrate

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/runtimesupport"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// The checks of a node pair below are the engine's (preflight and setup)
// and check's alike: check reports each Refusal's finding and remedy apart,
// the engine as one line.

// Refusal is a finding that stops a migration before it changes anything,
// with what to change.
type Refusal struct{ Finding, Remedy string }

func (r *Refusal) Error() string { return r.Finding + "; " + r.Remedy }

func refuse(remedy, format string, args ...any) error {
	return &Refusal{Finding: fmt.Sprintf(format, args...), Remedy: remedy}
}

// NodePair reads the nodes a migration goes from and to, and checks what
// any migration between them needs of them: both there and Ready, the
// target open to new pods, the source's runtime able to checkpoint.
func NodePair(ctx context.Context, client kubernetes.Interface, from, to string) (source, target *corev1.Node, err error) {
	get := func(name string) (*corev1.Node, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, refuse("list nodes with kubectl get nodes", "node %s not found", name)
		}
		if err != nil {
			return nil, fmt.Errorf("get node %s: %w", name, err)
		}
		if !kube.NodeReady(n) {
			return nil, refuse("pick a Ready node", "node %s is not Ready", name)
		}
		return n, nil
	}
	if source, err = get(from); err != nil {
		return nil, nil, err
	}
	if target, err = get(to); err != nil {
		return nil, nil, err
	}
	if target.Spec.Unschedulable {
		return nil, nil, refuse("uncordon it or pick another node", "node %s is cordoned", to)
	}
	version := source.Status.NodeInfo.ContainerRuntimeVersion
	if s := runtimesupport.Parse(version); !s.Checkpoint {
		return nil, nil, refuse(s.Why, "source node %s cannot checkpoint with %s", from, version)
	}
	return source, target, nil
}

// RestoreNeeds is what ChooseRestore weighs.
type RestoreNeeds struct {
	Want   Restore // "" picks one
	Target *corev1.Node
	// Source is set when the source node must restore the same way: a
	// StatefulSet pod's rollback and its move back restore it there.
	Source *corev1.Node
}

// ChooseRestore picks how the target restores: through the
// kubectl-migrate runtime where node-setup installed it, else through its
// container runtime where that restores; a node with neither is refused
// with both remedies. Note, when not empty, says why it picked the
// kubectl-migrate runtime without being asked to.
func ChooseRestore(n RestoreNeeds) (via Restore, note string, err error) {
	s := runtimesupport.Parse(n.Target.Status.NodeInfo.ContainerRuntimeVersion)
	nodes := []*corev1.Node{n.Target}
	if n.Source != nil {
		nodes = append(nodes, n.Source)
	}
	var missing []string
	for _, node := range nodes {
		if _, installed := node.Labels[ociruntime.NodeLabel]; !installed {
			missing = append(missing, node.Name)
		}
	}
	setup := version.Command() + " node-setup " + strings.Join(missing, " ")
	runtimeRemedy := fmt.Sprintf("or install the kubectl-migrate runtime there: %s", setup)
	if n.Source != nil {
		runtimeRemedy = fmt.Sprintf("or install the kubectl-migrate runtime on both nodes, as a StatefulSet pod's rollback restores it on %s: %s", n.Source.Name, setup)
	}
	switch n.Want {
	case RestoreCRI:
		if !s.Restore {
			return "", "", refuse(s.Why+"; "+runtimeRemedy+", and pass --restore runtime", "target node %s cannot restore checkpoints through its runtime", n.Target.Name)
		}
		return RestoreCRI, "", nil
	case RestoreRuntime:
		if len(missing) > 0 {
			return "", "", refuse("run "+setup, "node %s has no kubectl-migrate runtime (no %s label)", strings.Join(missing, " and "), ociruntime.NodeLabel)
		}
		return RestoreRuntime, "", nil
	}
	// The kubectl-migrate runtime first where it is installed: it makes no
	// image any pod of the node could run, and restores faster.
	switch {
	case len(missing) == 0 && !s.Restore:
		return RestoreRuntime, fmt.Sprintf("node %s's runtime does not restore (%s): restoring through the kubectl-migrate runtime", n.Target.Name, s.Why), nil
	case len(missing) == 0:
		return RestoreRuntime, fmt.Sprintf("the kubectl-migrate runtime is installed on node %s: restoring through it, with no checkpoint image (--restore cri for the container runtime's restore)", n.Target.Name), nil
	case s.Restore:
		return RestoreCRI, "", nil
	}
	return "", "", refuse(s.Why+"; "+runtimeRemedy, "target node %s cannot restore checkpoints", n.Target.Name)
}

// TargetRestores asks target's container runtime, through target's warm
// agent, whether its configuration lets it restore: a runtime whose restore
// is opt-in (containerd 2.2.7+/2.3.4+, CRI-O patch releases from September
// 2026) and left at its default is refused, with the setting to change. A
// runtime that does not say keeps the verdict its version gave; reported
// says whether it said, and found what was seen either way.
func TargetRestores(ctx context.Context, packer Packer, target *corev1.Node) (found string, reported bool, err error) {
	version := target.Status.NodeInfo.ContainerRuntimeVersion
	s := runtimesupport.Parse(version)
	if agent.RuntimeSocket(version) == "" {
		return version + " on " + target.Name + ": its agent does not know how to ask it whether it restores; going by its version", false, nil
	}
	info, err := packer.Runtime(ctx, target.Name)
	if err != nil {
		return fmt.Sprintf("%s did not say whether it restores (%v); going by its version", version, err), false, nil
	}
	s = s.WithConfig(info.Config)
	switch {
	case !s.Restore:
		return "", true, refuse(s.Why, "target node %s: %s %s does not restore", target.Name, info.Name, info.Version)
	case s.Configured && s.OptIn != "":
		return fmt.Sprintf("%s %s on %s: restore is opted in", info.Name, info.Version, target.Name), true, nil
	}
	return fmt.Sprintf("%s %s on %s restores by default", info.Name, info.Version, target.Name), true, nil
}
