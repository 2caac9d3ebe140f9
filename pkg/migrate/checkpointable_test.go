package migrate_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
)

// TestUncheckpointable: what ties a process to its node, or holds device
// state, keeps a pod from moving, named; the node's CPU, memory, storage
// and huge pages do not.
func TestUncheckpointable(t *testing.T) {
	limits := func(name corev1.ResourceName) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) {
			s.Containers[0].Resources.Limits = corev1.ResourceList{name: resource.MustParse("1")}
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*corev1.PodSpec)
		want   string
	}{
		{"plain", func(*corev1.PodSpec) {}, ""},
		{"cpu, memory, storage and huge pages", func(s *corev1.PodSpec) {
			s.Containers[0].Resources.Limits = corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("1Gi"),
				corev1.ResourceEphemeralStorage: resource.MustParse("1Gi"), "hugepages-2Mi": resource.MustParse("2Mi"),
			}
		}, ""},
		{"host network", func(s *corev1.PodSpec) { s.HostNetwork = true }, "hostNetwork"},
		{"host PID", func(s *corev1.PodSpec) { s.HostPID = true }, "hostPID"},
		{"host IPC", func(s *corev1.PodSpec) { s.HostIPC = true }, "hostIPC"},
		{"a GPU", limits("nvidia.com/gpu"), "container app uses the device nvidia.com/gpu"},
		{"another plugin's device, requested by an init container", func(s *corev1.PodSpec) {
			s.InitContainers = []corev1.Container{{Name: "warmup", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{"example.com/fpga": resource.MustParse("1")}}}}
		}, "container warmup uses the device example.com/fpga"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}}}
			tc.change(&pod.Spec)
			got := migrate.Uncheckpointable(pod)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}
