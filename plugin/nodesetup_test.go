package plugin

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ociruntime"
)

// A node's status from before its runtime restarted is Ready with a
// version: the wait after node-setup must hold out for the handler being
// listed (installed) or gone (uninstalled), where the kubelet lists them.
func TestWaitNodeReadyWaitsForTheHandler(t *testing.T) {
	node := func(handlers ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
		n.Status.NodeInfo.ContainerRuntimeVersion = "containerd://2.4.1"
		for _, h := range handlers {
			n.Status.RuntimeHandlers = append(n.Status.RuntimeHandlers, corev1.NodeRuntimeHandler{Name: h})
		}
		return n
	}
	for _, tc := range []struct {
		name      string
		node      *corev1.Node
		installed bool
		ready     bool
	}{
		{"installed, still the status from before", node("", "runc"), true, false},
		{"installed, listed", node("", "runc", ociruntime.HandlerName), true, true},
		{"uninstalled, still the status from before", node("", "runc", ociruntime.HandlerName), false, false},
		{"uninstalled, gone", node("", "runc"), false, true},
		{"a kubelet that lists no handlers", node(), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			err := waitNodeReady(ctx, fake.NewClientset(tc.node), "n1", tc.installed)
			if (err == nil) != tc.ready {
				t.Fatalf("waitNodeReady: %v, want ready %v", err, tc.ready)
			}
		})
	}
}
