package migrate

import (
	"context"
	"math"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// The freeze of a checkpoint/restore move where the cluster has no earlier
// moves to fit: the lab's medians through the CRI (the slower restore
// path) in docs/bench/any-pod-freeze.txt, 2 CPUs: 0.99 s for an idle Redis,
// 4.0 s holding 321 MiB.
const (
	labFreezeBaseMillis   = 990
	labFreezeMillisPerMiB = 9.4
)

// freezeHistoryRuns is how many of the cluster's newest checkpoint/restore
// moves a freeze is fitted on.
const freezeHistoryRuns = 20

// FreezeModel predicts checkpoint/restore freezes from a cluster's earlier
// such moves: the freeze grows with the memory CRIU dumps, sends and
// restores. It reads the records once, at its first prediction.
type FreezeModel struct {
	client    kubernetes.Interface
	namespace string
	fit       *freezeFit
}

type freezeFit struct {
	baseMillis, millisPerByte float64
	runs                      int
}

// NewFreezeModel predicts from the cluster's newest successful
// checkpoint/restore moves (their checkpoint's size against their
// downtime; of namespace if the cluster's records cannot be listed). With
// fewer than two of different sizes it uses the lab's figures.
func NewFreezeModel(client kubernetes.Interface, namespace string) *FreezeModel {
	return &FreezeModel{client: client, namespace: namespace}
}

// Predict is the freeze expected for pod, from its memory (kube.PodMemory).
func (f *FreezeModel) Predict(ctx context.Context, pod *corev1.Pod) *report.Freeze {
	if f.fit == nil {
		fit := fitFreeze(f.history(ctx))
		f.fit = &fit
	}
	bytes, from := kube.PodMemory(ctx, f.client, pod)
	p := &report.Freeze{MemoryBytes: bytes, MemoryFrom: from, FromRuns: f.fit.runs}
	if from != "" {
		p.Millis = int64(f.fit.baseMillis + f.fit.millisPerByte*float64(bytes))
	}
	return p
}

func (f *FreezeModel) history(ctx context.Context) []*report.Record {
	return recentRecords(ctx, f.client, f.namespace, freezeHistoryRuns, func(r *report.Record) bool {
		return r.Outcome == report.Succeeded && r.Strategy == string(CheckpointRestore) && r.Downtime != nil && r.Downtime.Millis > 0 && r.ArchiveBytes > 0
	})
}

// fitFreeze is the least-squares line through the moves' (checkpoint
// bytes, downtime), or the lab's where they cannot make one.
func fitFreeze(moves []*report.Record) freezeFit {
	lab := freezeFit{baseMillis: labFreezeBaseMillis, millisPerByte: labFreezeMillisPerMiB / (1 << 20)}
	n := float64(len(moves))
	var sx, sy, sxx, sxy float64
	for _, r := range moves {
		x, y := float64(r.ArchiveBytes), float64(r.Downtime.Millis)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	spread := n*sxx - sx*sx
	// Sizes within a MiB of each other cannot say how the freeze grows.
	if len(moves) < 2 || spread <= n*n*float64(1<<20)*float64(1<<20)/4 {
		return lab
	}
	slope := (n*sxy - sx*sy) / spread
	if slope < 0 { // noise over sizes that barely matter
		slope = 0
	}
	return freezeFit{baseMillis: math.Max(0, (sy-slope*sx)/n), millisPerByte: slope, runs: len(moves)}
}
