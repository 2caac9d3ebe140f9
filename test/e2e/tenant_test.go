//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/ms2m"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// TestCheckpointRunByAnotherNamespaceNeverConsumes: after a migration, a pod
// of another namespace pinned to the target node names the checkpoint image
// (all it takes for the runtime to restore the victim's process into it).
// The restored copy finds itself in a pod no migration named, holds for
// good and consumes nothing: the victim conserves every message.
func TestCheckpointRunByAnotherNamespaceNeverConsumes(t *testing.T) {
	l, w, rec := migrateLivePod(t)
	if len(rec.Images) != 1 {
		t.Fatalf("images %v", rec.Images)
	}
	ctx := context.Background()
	thief := workload.Attach(l.client, fmt.Sprintf("attacker-%06x", rand.Uint32()>>8), w.Exchange, w.Queue)
	if _, err := l.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: thief.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = thief.Delete(context.Background()) })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "thief", Namespace: thief.Namespace},
		Spec: corev1.PodSpec{
			NodeName: "node-b",
			Containers: []corev1.Container{{
				Name: "consumer", Image: rec.Images[0], ImagePullPolicy: corev1.PullIfNotPresent,
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}},
		},
	}
	// The namespace's default service account appears asynchronously.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := l.client.CoreV1().ServiceAccounts(thief.Namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.client.CoreV1().Pods(thief.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The runtime restores the victim's process into the thief's pod; once
	// it has reconnected it knows where it runs.
	st, err := thief.WaitFor(ctx, "thief", 2*time.Minute, func(st ms2m.State) bool { return st.Reconnects > 0 })
	if err != nil {
		t.Fatalf("the thief's copy never answered: %v (%+v)", err, st)
	}
	t.Logf("the thief's pod runs the victim's process %s: mode %s, foreign %q, homes %v", st.Process, st.Mode, st.Foreign, st.Homes)
	if victim := state(t, w, rec.TargetPod); st.Process != victim.Process {
		t.Fatalf("the thief's pod runs process %s, not the victim's %s: the runtime did not restore the checkpoint, so this proves nothing", st.Process, victim.Process)
	}
	if st.Foreign != thief.Namespace+"/thief" || st.Mode != ms2m.ModeHold {
		t.Fatalf("the copy in another namespace's pod does not hold as foreign: %+v", st)
	}
	if _, err := thief.Control(ctx, "thief", ms2m.Control{Type: ms2m.Resume}); err == nil {
		t.Fatal("the foreign copy obeyed RESUME")
	}
	// Whatever it consumed, the victim would lack.
	checkConservation(t, w, rec.TargetPod)
	if after, err := thief.State(ctx, "thief"); err != nil || after.Position() != st.Position() || after.Mode != ms2m.ModeHold {
		t.Fatalf("the foreign copy moved from %s: %+v (%v)", st.Position(), after, err)
	}
}
