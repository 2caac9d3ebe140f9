package drain

import (
	"context"
	"fmt"
	"strings"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Movability is whether and how a pod can be migrated (kubectl migrate
// check --pods lists it for every pod); a drain moves every pod that can.
type Movability struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Node      string `json:"node"`
	Moves     bool   `json:"moves"`
	// How, for a pod that moves: the command and what it keeps; Why, for
	// one that does not: the reason.
	How string `json:"how,omitempty"`
	Why string `json:"why,omitempty"`
	// Volumes are the emptyDir volumes whose data moves with it.
	Volumes []string `json:"volumes,omitempty"`
	// Strategy is how it moves: MS2M with the contract, checkpoint/restore
	// without.
	Strategy migrate.Strategy `json:"strategy,omitempty"`
	// Freeze is what a checkpoint/restore move's clients are expected to
	// wait (PredictFreezes sets it).
	Freeze *report.Freeze `json:"freeze,omitempty"`
}

// Movable says whether and how pod can be migrated.
func Movable(pod *corev1.Pod) Movability {
	m := Movability{Namespace: pod.Namespace, Pod: pod.Name, Node: pod.Spec.NodeName}
	sts, reason, _ := classify(pod)
	if reason != "" {
		m.Why = reason
		return m
	}
	m.Moves = true
	var containers []string
	for _, c := range pod.Spec.Containers {
		containers = append(containers, c.Name)
	}
	m.Volumes = migrate.CarriedVolumes(pod, containers)
	contract := pod.Annotations[migrate.QueueAnnotation] != ""
	strategy := "MS2M"
	m.Strategy = migrate.MS2M
	if !contract {
		strategy, m.Strategy = "checkpoint/restore (no MS2M contract)", migrate.CheckpointRestore
	}
	owner := metav1.GetControllerOf(pod)
	switch {
	case sts != "":
		m.How = fmt.Sprintf("%s sts %s: %s, keeping its name, ordinal and volume claims (StatefulSet %s)", version.Command(), pod.Name, strategy, sts)
	case owner != nil && owner.Kind == "ReplicaSet":
		m.How = fmt.Sprintf("%s pod %s: %s; the copy joins ReplicaSet %s", version.Command(), pod.Name, strategy, owner.Name)
	default:
		m.How = fmt.Sprintf("%s pod %s: %s", version.Command(), pod.Name, strategy)
	}
	if !contract {
		// What its clients see, since nothing tells it that it moves.
		m.How += ": cut off the network while it moves, its connections are reset and its clients reconnect"
	}
	if len(m.Volumes) > 0 {
		m.How += "; emptyDir " + strings.Join(m.Volumes, ", ") + " move with it"
	}
	return m
}

// PredictFreezes adds to each row that moves with checkpoint/restore the
// freeze its clients are expected to wait, from its pod's memory and the
// cluster's earlier such moves (migrate.FreezeModel); rows[i] is pods[i]'s.
func PredictFreezes(ctx context.Context, client kubernetes.Interface, namespace string, rows []Movability, pods []*corev1.Pod) {
	model := migrate.NewFreezeModel(client, namespace)
	for i, pod := range pods {
		if r := &rows[i]; r.Moves && r.Strategy == migrate.CheckpointRestore {
			r.Freeze = model.Predict(ctx, pod)
			r.How += "; " + r.Freeze.Summary()
		}
	}
}
