package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// TestCheckControllerReadsTheLease: a migration goes ahead only while a
// controller renews its lease.
func TestCheckControllerReadsTheLease(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	lease := func(holder string, renewed time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: ControllerName, Namespace: DefaultNamespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), LeaseDurationSeconds: ptr.To[int32](15),
				RenewTime: &metav1.MicroTime{Time: renewed}},
		}
	}
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
		want  string
	}{
		{"renewed", lease("controller-1", now.Add(-5*time.Second)), ""},
		{"a clock a little behind", lease("controller-1", now.Add(-25*time.Second)), ""},
		{"never installed", nil, "has never run in namespace kubectl-migrate-system: have an administrator install it with kubectl migrate node-setup --agents-only"},
		{"released on shutdown", lease("", now.Add(-time.Second)), "is not running"},
		{"stopped renewing", lease("controller-1", now.Add(-time.Minute)), "is not running (its lease was last renewed 2026-12-05T11:59:00Z)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.lease != nil {
				client = fake.NewClientset(tc.lease)
			}
			err := CheckController(context.Background(), client, DefaultNamespace, now)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

// TestControllerHoldsItsLease: a running controller renews the lease
// CheckController reads, and gives it up when it stops, so a migration
// hears at once that none serves.
func TestControllerHoldsItsLease(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	c := Controller{Client: client, Namespace: DefaultNamespace, Image: "agent:1", Identity: "controller-0",
		PolicySince: func(context.Context) (time.Time, error) { return time.Time{}, nil }}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return CheckController(ctx, client, DefaultNamespace, time.Now()) == nil, nil
	})
	if err != nil {
		t.Fatalf("the controller never took its lease: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("a stopped controller: %v", err)
	}
	if err := CheckController(context.Background(), client, DefaultNamespace, time.Now()); err == nil || !strings.Contains(err.Error(), "is not running") {
		t.Fatalf("after it stopped: %v", err)
	}
}
