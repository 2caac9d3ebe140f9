package kube

import corev1 "k8s.io/api/core/v1"

// NodeReady reports whether n's Ready condition is true.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
