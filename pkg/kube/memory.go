package kube

import (
	"context"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// Where a pod's memory figure came from.
const (
	MemoryFromMetrics = "metrics.k8s.io"
	MemoryFromLimits  = "memory limits"
)

// metricsWait bounds the question to metrics.k8s.io: a plan does not wait
// on an aggregated API that is slow to answer.
const metricsWait = 3 * time.Second

// PodMemory is how much memory pod's containers hold, and where the figure
// came from: their working set from metrics.k8s.io (what kubectl top pod
// shows), or, where that API is not served or does not know the pod, the
// sum of their memory limits (an upper bound; only if every container has
// one). 0 and "": neither tells.
func PodMemory(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) (bytes int64, from string) {
	if bytes := workingSet(ctx, client, pod); bytes > 0 {
		return bytes, MemoryFromMetrics
	}
	for _, c := range pod.Spec.Containers {
		limit, ok := c.Resources.Limits[corev1.ResourceMemory]
		if !ok {
			return 0, ""
		}
		bytes += limit.Value()
	}
	if bytes == 0 {
		return 0, ""
	}
	return bytes, MemoryFromLimits
}

// workingSet asks metrics.k8s.io for pod's containers' working set; 0 if
// it cannot tell (not served, forbidden, the pod too new to be measured).
func workingSet(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) int64 {
	// The metrics API is aggregated under the API server: its path through
	// the client's own transport, rather than a second clientset and config.
	rest := client.Discovery().RESTClient()
	if rest == nil { // a fake clientset's
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, metricsWait)
	defer cancel()
	raw, err := rest.Get().AbsPath("/apis", metricsv1beta1.SchemeGroupVersion.Group, metricsv1beta1.SchemeGroupVersion.Version,
		"namespaces", pod.Namespace, "pods", pod.Name).DoRaw(ctx)
	if err != nil {
		return 0
	}
	var m metricsv1beta1.PodMetrics
	if json.Unmarshal(raw, &m) != nil {
		return 0
	}
	var bytes int64
	for _, c := range m.Containers {
		if q, ok := c.Usage[corev1.ResourceMemory]; ok {
			bytes += q.Value()
		}
	}
	return bytes
}
