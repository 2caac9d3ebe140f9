package plugin

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

const stsExample = `  # Move ordinal 0 of StatefulSet consumer to node-b, keeping its identity
  kubectl migrate sts consumer-0 --to node-b

  # The same, naming the StatefulSet and the ordinal
  kubectl migrate sts sts/consumer --ordinal 0 --to node-b

  # The stop-and-copy baseline
  kubectl migrate sts consumer-0 --to node-b --strategy stop-and-copy`

const stsLong = `Live-migrate one pod of a StatefulSet to another node, keeping its name,
ordinal and labels (sequential mode).

A StatefulSet pod's identity cannot exist twice, so the source goes away
before its restored copy exists: the source is checkpointed (after the replay
queue is bound, with MS2M) and its image pushed; then the source stops, the
StatefulSet is deleted with its pods orphaned (deleting only the pod would make
the controller recreate it on the old node at once), the source pod is
deleted, the checkpoint is restored under the same name on the target node,
and the StatefulSet is created again from its saved spec, adopting the moved
pod and leaving the other ordinals untouched. The restored pod replays up to
the source's last message and takes over its queue. Downtime therefore spans
from the source stopping to the copy catching up.

On failure the StatefulSet and the source come back as they were: if the
source pod was already deleted, its checkpoint is restored on the source node
under the same name and replays up to where it stopped.

Pods with PersistentVolumeClaims are refused for now. Everything said in
"kubectl migrate pod --help" about registries, secrets, annotations and
requirements applies; RBAC additionally needs get, delete and create on
statefulsets.`

// NewCmdSts returns kubectl migrate sts.
func NewCmdSts(root *RootOptions) *cobra.Command {
	o := &PodOptions{RootOptions: root}
	var ordinal int
	cmd := &cobra.Command{
		Use:               "sts NAME-ORDINAL --to NODE",
		Aliases:           []string{"statefulset"},
		Short:             "Live-migrate a StatefulSet pod, keeping its identity",
		Long:              stsLong,
		Example:           stsExample,
		Args:              exactlyOne("the pod: kubectl migrate sts NAME-ORDINAL --to NODE, or sts/NAME --ordinal N"),
		ValidArgsFunction: completePods(root),
		RunE:              runE(o),
	}
	o.addFlags(cmd, false)
	cmd.Flags().IntVar(&ordinal, "ordinal", -1, "the pod's ordinal, with sts/NAME")
	o.stsArg = func(arg string) error {
		name, pod, err := parseStsArg(arg, ordinal)
		o.config.StatefulSet, o.config.Pod = name, pod
		return err
	}
	return cmd
}

// parseStsArg reads NAME-ORDINAL, or sts/NAME with --ordinal.
func parseStsArg(arg string, ordinal int) (statefulSet, pod string, err error) {
	for _, prefix := range []string{"sts/", "statefulset/", "statefulsets/", "statefulset.apps/"} {
		if name, ok := strings.CutPrefix(arg, prefix); ok {
			if ordinal < 0 {
				return "", "", fmt.Errorf("%s names a StatefulSet; give the pod's ordinal with --ordinal N", arg)
			}
			return name, fmt.Sprintf("%s-%d", name, ordinal), nil
		}
	}
	i := strings.LastIndexByte(arg, '-')
	n, convErr := strconv.Atoi(arg[i+1:])
	if i <= 0 || convErr != nil || n < 0 {
		return "", "", fmt.Errorf("%q is not NAME-ORDINAL; give the pod (e.g. consumer-0) or sts/NAME --ordinal N", arg)
	}
	if ordinal >= 0 && ordinal != n {
		return "", "", fmt.Errorf("%s is ordinal %d, but --ordinal says %d", arg, n, ordinal)
	}
	return arg[:i], arg, nil
}
