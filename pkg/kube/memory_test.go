package kube

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

// A pod's memory is its containers' working set where metrics.k8s.io
// knows it, else the sum of their memory limits (every container must have
// one), else unknown.
func TestPodMemory(t *testing.T) {
	limited := func(limits ...string) *corev1.Pod {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "redis", Namespace: "shop"}}
		for _, l := range limits {
			c := corev1.Container{Name: "c"}
			if l != "" {
				c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(l)}
			}
			pod.Spec.Containers = append(pod.Spec.Containers, c)
		}
		return pod
	}
	// An API server that serves metrics.k8s.io for shop/redis only.
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods/redis" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"PodMetrics","apiVersion":"metrics.k8s.io/v1beta1","metadata":{"name":"redis","namespace":"shop"},
			"containers":[{"name":"a","usage":{"cpu":"1m","memory":"300Mi"}},{"name":"b","usage":{"cpu":"1m","memory":"21Mi"}}]}`))
	}))
	defer server.Close()
	served, err := kubernetes.NewForConfig(&rest.Config{Host: server.URL})
	if err != nil {
		t.Fatal(err)
	}
	other := limited("1Gi")
	other.Name = "other"
	for _, tc := range []struct {
		name   string
		client kubernetes.Interface
		pod    *corev1.Pod
		bytes  int64
		from   string
	}{
		{"working set", served, limited("1Gi"), 321 << 20, MemoryFromMetrics},
		{"a pod the metrics do not know: its limit", served, other, 1 << 30, MemoryFromLimits},
		{"no metrics API: the sum of the limits", fake.NewClientset(), limited("512Mi", "256Mi"), 768 << 20, MemoryFromLimits},
		{"a container without a limit", fake.NewClientset(), limited("512Mi", ""), 0, ""},
		{"nothing", fake.NewClientset(), limited(""), 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bytes, from := PodMemory(context.Background(), tc.client, tc.pod)
			if bytes != tc.bytes || from != tc.from {
				t.Fatalf("got %d bytes from %q, want %d from %q", bytes, from, tc.bytes, tc.from)
			}
		})
	}
}
