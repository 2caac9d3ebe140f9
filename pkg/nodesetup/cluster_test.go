package nodesetup

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

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

// An uninstall leaves no pod without its runtime: it refuses while one
// runs under the RuntimeClass, and waits for those being deleted.
func TestUninstallWaitsForThePodsOfTheRuntimeClass(t *testing.T) {
	nodes := []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}}
	pod := func(name string, ending bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop"}}
		p.Spec.NodeName, p.Spec.RuntimeClassName, p.Status.Phase = "n1", ptr.To(ociruntime.HandlerName), corev1.PodRunning
		if ending {
			p.DeletionTimestamp, p.Finalizers = &metav1.Time{Time: time.Now()}, []string{"test"}
		}
		return p
	}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "shop"}, Spec: corev1.PodSpec{NodeName: "n1"}}
	var progress strings.Builder

	client := fake.NewClientset(other, pod("restored", false))
	err := (Cluster{Client: client, Progress: &progress}).refuseWhileRestoredPodsRun(context.Background(), nodes)
	if err == nil || !strings.Contains(err.Error(), "shop/restored on n1") {
		t.Fatalf("with a restored pod running: %v", err)
	}

	// The pod's deletion ends, as the kubelet would end it, a while later.
	goneLater := func(client *fake.Clientset, name string) {
		time.Sleep(1500 * time.Millisecond)
		_ = client.CoreV1().Pods("shop").Delete(context.Background(), name, metav1.DeleteOptions{})
	}
	client = fake.NewClientset(other, pod("going", true))
	go goneLater(client, "going")
	if err := (Cluster{Client: client, Progress: &progress}).refuseWhileRestoredPodsRun(context.Background(), nodes); err != nil {
		t.Fatalf("with a restored pod being deleted: %v", err)
	}
	if !strings.Contains(progress.String(), "waiting for 1 pods under RuntimeClass kubectl-migrate to end (shop/going)") {
		t.Fatalf("progress: %q", progress.String())
	}

	// A pod of a namespace being deleted is going too, marked or not.
	shop := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", DeletionTimestamp: &metav1.Time{Time: time.Now()}, Finalizers: []string{"kubernetes"}}}
	client = fake.NewClientset(shop, pod("in-a-namespace-going", false))
	go goneLater(client, "in-a-namespace-going")
	if err := (Cluster{Client: client, Progress: &progress}).refuseWhileRestoredPodsRun(context.Background(), nodes); err != nil {
		t.Fatalf("with a restored pod whose namespace is being deleted: %v", err)
	}
}
