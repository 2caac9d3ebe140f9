package lease

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// TestRenewalFailureLosesTheLock: a holder whose renewals fail gives its
// lease up for lost before a taker watching it could see it expire (a lease
// duration after the last renewal that reached the API server), and at once
// when someone else changed it.
func TestRenewalFailureLosesTheLock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fail   error
		before time.Duration // the loss must come this soon after the last good renewal
	}{
		{"API server unreachable", errors.New("connection refused"), 2 * time.Second},
		{"changed by another process", apierrors.NewConflict(coordinationv1.Resource("leases"), "l", errors.New("modified")), 500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			var failing atomic.Bool
			var lastGood atomic.Int64
			client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, kruntime.Object, error) {
				if failing.Load() {
					return true, nil, tc.fail
				}
				lastGood.Store(time.Now().UnixNano())
				return false, nil, nil
			})
			lost := make(chan error, 1)
			l := &Set{Client: client, Namespace: "default", ID: "abcde", duration: 2 * time.Second, renewEvery: 100 * time.Millisecond,
				Lost: func(err error) { lost <- err }}
			if err := l.Acquire(context.Background(), "kubectl-migrate-pod-consumer", "pod consumer", false, false); err != nil {
				t.Fatal(err)
			}
			l.StartRenewing()
			defer l.Release(context.Background())
			waitFor(t, func() bool { return lastGood.Load() != 0 }) // renewing
			failing.Store(true)
			select {
			case err := <-lost:
				if !errors.Is(err, ErrLost) {
					t.Fatalf("lost with %v", err)
				}
				if since := time.Since(time.Unix(0, lastGood.Load())); since > tc.before {
					t.Fatalf("lost %s after the last renewal, want under %s", since, tc.before)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the holder never gave up a lease it could not renew")
			}
		})
	}
}

// TestExpiryIsObservedNotCompared: whether a lease expired is judged by
// watching its RenewTime stand still, not by comparing the holder's clock
// with ours. A live holder whose clock is an hour behind keeps its lease; a
// dead one whose clock was an hour ahead loses it after one lease duration.
func TestExpiryIsObservedNotCompared(t *testing.T) {
	ctx := context.Background()
	lease := func(renewed time.Time) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: Name("pod", "consumer"), Namespace: "default", Labels: map[string]string{MigrationLabel: "abcde"},
				Annotations: map[string]string{HostAnnotation: "elsewhere pid 1", ProcessAnnotation: "another-boot/pid:[1]/1/1"}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("abcde"), LeaseDurationSeconds: ptr.To(int32(2)), RenewTime: ptr.To(metav1.NewMicroTime(renewed))},
		}
	}
	t.Run("live holder, clock behind", func(t *testing.T) {
		behind := time.Now().Add(-time.Hour)
		client := fake.NewClientset(lease(behind))
		stop := make(chan struct{})
		defer close(stop)
		go func() { // the holder renews with its own clock
			for tick := 1; ; tick++ {
				select {
				case <-stop:
					return
				case <-time.After(300 * time.Millisecond):
				}
				l, err := client.CoordinationV1().Leases("default").Get(ctx, Name("pod", "consumer"), metav1.GetOptions{})
				if err != nil {
					return
				}
				l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(behind.Add(time.Duration(tick) * 300 * time.Millisecond)))
				_, _ = client.CoordinationV1().Leases("default").Update(ctx, l, metav1.UpdateOptions{})
			}
		}()
		if n, err := ReleaseStale(ctx, client, "default", "abcde"); err == nil || !strings.Contains(err.Error(), "still running") || n != 0 {
			t.Fatalf("released a lease its holder renews: %d, %v", n, err)
		}
	})
	t.Run("dead holder, clock ahead", func(t *testing.T) {
		client := fake.NewClientset(lease(time.Now().Add(time.Hour)))
		start := time.Now()
		if n, err := ReleaseStale(ctx, client, "default", "abcde"); err != nil || n != 1 {
			t.Fatalf("released %d: %v", n, err)
		}
		if took := time.Since(start); took < 2*time.Second {
			t.Fatalf("released after %s, before a whole lease duration", took)
		}
	})
}

// TestHolderGoneOnlyOnThisMachine: a holder whose process is gone is known
// so at once only when it ran in this kernel boot and PID namespace; a
// holder with our hostname and a PID we do not run, on another machine, is
// waited out.
func TestHolderGoneOnlyOnThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("processes are identified on Linux only")
	}
	me := thisProcess()
	if me == "" || holderGone(me) {
		t.Fatalf("this process (%q) is gone", me)
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(me, "/")
	dead := strings.Join([]string{parts[0], parts[1], strconv.Itoa(cmd.Process.Pid), "1"}, "/")
	if !holderGone(dead) {
		t.Fatalf("a process that exited (%s) is not gone", dead)
	}
	reused := strings.Join([]string{parts[0], parts[1], strconv.Itoa(os.Getpid()), "1"}, "/")
	if !holderGone(reused) {
		t.Fatal("our PID with another start time is another, gone, process")
	}
	elsewhere := strings.Join([]string{"0c9b4b4e-0000-4000-8000-000000000000", parts[1], strconv.Itoa(cmd.Process.Pid), "1"}, "/")
	if holderGone(elsewhere) {
		t.Fatal("a process of another machine with a PID free here was taken for gone")
	}
	if holderGone("") || holderGone("a/b") {
		t.Fatal("an unidentified holder was taken for gone")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		t.Fatal(err)
	}
}

// TestReleaseDeletesALeaseItsCopyIsBehindOn: a renewal that reached the API
// server after the renewer stopped waiting leaves the held copy one
// resourceVersion behind, and a busy API server fails the first delete;
// Release still removes the lease. A lease another migration took over
// since (another holder) is left to it.
func TestReleaseDeletesALeaseItsCopyIsBehindOn(t *testing.T) {
	for _, tc := range []struct {
		name      string
		takenOver bool
		wantGone  bool
	}{
		{"still ours", false, true},
		{"another migration's now", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			var deletes atomic.Int32
			// The fake clientset ignores delete preconditions; the API
			// server does not.
			client.PrependReactor("delete", "leases", func(a k8stesting.Action) (bool, kruntime.Object, error) {
				if deletes.Add(1) == 1 {
					return true, nil, apierrors.NewServerTimeout(coordinationv1.Resource("leases"), "delete", 1)
				}
				del := a.(k8stesting.DeleteActionImpl)
				cur, err := client.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), del.Namespace, del.Name)
				if err != nil {
					return true, nil, err
				}
				if rv := del.DeleteOptions.Preconditions.ResourceVersion; rv != nil && *rv != cur.(*coordinationv1.Lease).ResourceVersion {
					return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), del.Name, errors.New("the object has been modified"))
				}
				return false, nil, nil
			})
			ctx := context.Background()
			l := &Set{Client: client, Namespace: "default", ID: "abcde"}
			if err := l.Acquire(ctx, "kubectl-migrate-sts-consumer", "StatefulSet consumer", false, false); err != nil {
				t.Fatal(err)
			}
			// The renewal the holder never saw answered.
			api := client.CoordinationV1().Leases("default")
			seen, err := api.Get(ctx, "kubectl-migrate-sts-consumer", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			seen.ResourceVersion = "7"
			if tc.takenOver {
				seen.Spec.HolderIdentity = ptr.To("other")
			}
			if _, err := api.Update(ctx, seen, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			l.Release(ctx)
			_, err = api.Get(ctx, "kubectl-migrate-sts-consumer", metav1.GetOptions{})
			if gone := apierrors.IsNotFound(err); gone != tc.wantGone {
				t.Fatalf("lease gone: %t (%v), want %t after %d deletes", gone, err, tc.wantGone, deletes.Load())
			}
		})
	}
}
