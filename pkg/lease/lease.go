// Package lease is the lock of a migration, and of a drain: a
// coordination.k8s.io Lease on each pod, StatefulSet or node it changes,
// renewed while its process runs, fenced (a holder that cannot vouch for its
// leases is told, and must stop changing the cluster), and taken over only
// by the recovery of the same migration.
package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/version"
)

// One migration at a time: a migration holds a coordination.k8s.io Lease on
// its pod and, for a StatefulSet pod, one on its StatefulSet (two ordinals
// must not race the StatefulSet's delete and re-create). The holder renews
// them while it runs. A migration that did not end for good (its process
// died, or its rollback stopped) leaves them un-renewed: they are never
// taken over by another migration, only by the recovery of the same one.
//
// The lock is fenced: a holder that cannot renew its leases in time, or
// finds them changed by someone else, stops changing the cluster (see
// ErrLost), and a taker judges expiry by watching RenewTime stand still
// for a lease duration on its own clock, never by comparing its clock with
// the holder's.
const (
	// leaseDuration outlasts an API server's restart (its graceful shutdown
	// alone may take 20 s, and its start as long again on a small control
	// plane): a migration rides that out rather than stop for want of its
	// lock. Recovery from another machine waits it out once; on the
	// machine the process ran on it need not.
	leaseDuration = 2 * time.Minute
	leaseRenew    = 5 * time.Second
	// HostAnnotation names the machine and process holding a lease, for
	// people.
	HostAnnotation = "migrate.ms2m.io/host"
	// ProcessAnnotation identifies the holding process exactly (kernel
	// boot, PID namespace, PID, start time), so that a taker on the same
	// machine can tell at once that it is gone.
	ProcessAnnotation = "migrate.ms2m.io/process"
	// abandonedSeconds is the duration abandon leaves on a lease: its holder
	// stopped renewing it for good.
	abandonedSeconds = 1
)

// MigrationLabel labels a lease with its migration's ID, as every object of
// a migration is labelled.
const MigrationLabel = "migrate.ms2m.io/migration"

// ErrLost ends a migration that can no longer be sure it holds its
// lock: it stops changing the cluster, keeping its journal, so that only one
// process (its recovery) goes on with it.
var ErrLost = errors.New("this migration lost its lock")

// LeaseName is the lease of a pod ("pod") or a StatefulSet ("sts").
func Name(kind, name string) string { return "kubectl-migrate-" + kind + "-" + name }

// Set is the leases one migration (or drain) holds.
type Set struct {
	Client    kubernetes.Interface
	Namespace string
	ID        string
	// duration and renewEvery default to leaseDuration and leaseRenew.
	duration, renewEvery time.Duration
	// Lost is told, once, why the leases can no longer be vouched for.
	Lost func(error)

	mu      sync.Mutex
	held    []*coordinationv1.Lease
	renewed time.Time // when the last renewal of all of them was sent
	lostErr error
	stop    context.CancelFunc
	done    sync.WaitGroup
}

// errLeaseHeld is returned when another migration holds a lease.
var errLeaseHeld = errors.New("held by another migration")

func (l *Set) defaults() {
	if l.duration == 0 {
		l.duration, l.renewEvery = leaseDuration, leaseRenew
	}
}

// Acquire takes lease name, guarding what (named in refusals): free, or
// (recovering) left un-renewed by this same migration. With checkOnly it only
// checks that nobody else holds it (a dry run).
func (l *Set) Acquire(ctx context.Context, name, what string, checkOnly, recovering bool) error {
	l.defaults()
	leasesAPI := l.Client.CoordinationV1().Leases(l.Namespace)
	now := metav1.NewMicroTime(time.Now())
	host, _ := os.Hostname()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.Namespace,
			Labels: map[string]string{kube.ManagedByLabel: kube.ManagedBy, MigrationLabel: l.ID},
			Annotations: map[string]string{
				HostAnnotation:    fmt.Sprintf("%s pid %d", host, os.Getpid()),
				ProcessAnnotation: thisProcess(),
			}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(l.ID), LeaseDurationSeconds: ptr.To(int32(l.duration.Seconds())),
			AcquireTime: &now, RenewTime: &now,
		},
	}
	existing, err := leasesAPI.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if checkOnly {
			return nil
		}
		sent := time.Now()
		created, err := leasesAPI.Create(ctx, lease, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: another migration took it a moment ago; see %s report", what, version.Command())
		}
		if err != nil {
			return fmt.Errorf("take lease %s on %s (needs create on leases.coordination.k8s.io): %w", name, what, err)
		}
		l.hold(created, sent)
		return nil
	case err != nil:
		return fmt.Errorf("read lease %s on %s: %w", name, what, err)
	}
	holder := ptr.Deref(existing.Spec.HolderIdentity, "")
	ended := holderEnded(existing)
	switch {
	case holder != l.ID && ended:
		return fmt.Errorf("%s is held by migration %s, which did not end (run by %s): %w; finish or undo it first: %s",
			what, holder, existing.Annotations[HostAnnotation], errLeaseHeld, report.RecoverCommand(l.Namespace, holder))
	case holder != l.ID:
		return fmt.Errorf("%s is being migrated by migration %s (run by %s): %w; wait for it to end, or follow it with %s report %s; if its process died, finish or undo it: %s",
			what, holder, existing.Annotations[HostAnnotation], errLeaseHeld, version.Command(), holder, report.RecoverCommand(l.Namespace, holder))
	case !recovering || checkOnly:
		return fmt.Errorf("%s: lease %s names this migration already: %w", what, name, errLeaseHeld)
	case !ended:
		if existing, err = awaitExpiry(ctx, l.Client, existing); err != nil {
			return fmt.Errorf("migration %s is still running on %s: %w; recover it only once that process has ended", l.ID, existing.Annotations[HostAnnotation], err)
		}
	}
	lease.ResourceVersion = existing.ResourceVersion
	sent := time.Now()
	updated, err := leasesAPI.Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("take over lease %s on %s: %w", name, what, err)
	}
	l.hold(updated, sent)
	return nil
}

// hold adds a lease taken with a request sent at sent.
func (l *Set) hold(lease *coordinationv1.Lease, sent time.Time) {
	if len(l.held) == 0 || sent.Before(l.renewed) {
		l.renewed = sent
	}
	l.held = append(l.held, lease)
}

// holderEnded reports whether a lease's holder is known to have stopped:
// it abandoned the lease, or its process is gone from this machine.
func holderEnded(l *coordinationv1.Lease) bool {
	return ptr.Deref(l.Spec.LeaseDurationSeconds, 0) <= abandonedSeconds || holderGone(l.Annotations[ProcessAnnotation])
}

// errStillRenewed is awaitExpiry's answer for a lease whose holder renewed
// it while it watched.
var errStillRenewed = errors.New("it renewed its lease a moment ago")

// awaitExpiry watches lease until its holder has left it un-renewed for a
// whole lease duration by this machine's clock (or is seen to have ended),
// and returns it as last seen; it fails as soon as the holder renews it.
func awaitExpiry(ctx context.Context, client kubernetes.Interface, lease *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	d := time.Duration(ptr.Deref(lease.Spec.LeaseDurationSeconds, 0)) * time.Second
	start, last := time.Now(), lease
	err := wait.PollUntilContextTimeout(ctx, min(time.Second, d/4+time.Millisecond), d+time.Minute, false, func(ctx context.Context) (bool, error) {
		cur, err := client.CoordinationV1().Leases(lease.Namespace).Get(ctx, lease.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if ptr.Deref(cur.Spec.HolderIdentity, "") != ptr.Deref(lease.Spec.HolderIdentity, "") || !renewTime(cur).Equal(renewTime(lease)) {
			return false, errStillRenewed
		}
		last = cur
		return holderEnded(cur) || time.Since(start) >= d, nil
	})
	return last, err
}

func renewTime(l *coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Time
}

// Lock takes the lease name (see LeaseName) in namespace for id, naming what
// it guards in refusals, and renews it until release is called; a drain
// holds its node's this way while its migrations take their pods' leases.
// lost is told if the lease can no longer be vouched for.
func Lock(ctx context.Context, client kubernetes.Interface, namespace, id, name, what string, lost func(error)) (release func(context.Context), err error) {
	l := &Set{Client: client, Namespace: namespace, ID: id, Lost: lost}
	if err := l.Acquire(ctx, name, what, false, false); err != nil {
		return nil, err
	}
	l.StartRenewing()
	return l.Release, nil
}

// StartRenewing renews the held leases until release, abandon or their
// loss.
func (l *Set) StartRenewing() {
	if len(l.held) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		wait.UntilWithContext(ctx, l.renew, l.renewEvery)
	}()
}

// renew renews every held lease. A lease changed by someone else is lost at
// once; one that cannot be renewed is lost before a taker watching it could
// see it expire (a lease duration after the last renewal that reached it).
func (l *Set) renew(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr != nil || ctx.Err() != nil {
		return
	}
	sent := time.Now()
	for i, lease := range l.held {
		next := lease.DeepCopy()
		next.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		next.Spec.LeaseDurationSeconds = ptr.To(int32(l.duration.Seconds()))
		callCtx, cancel := context.WithTimeout(ctx, l.renewEvery/2)
		updated, err := l.Client.CoordinationV1().Leases(l.Namespace).Update(callCtx, next, metav1.UpdateOptions{})
		cancel()
		switch {
		case err == nil:
			l.held[i] = updated
			continue
		case ctx.Err() != nil: // released meanwhile
			return
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			l.lose(fmt.Errorf("%w: lease %s was changed by another process (%v)", ErrLost, lease.Name, err))
		case time.Since(l.renewed) >= l.duration-l.renewEvery:
			l.lose(fmt.Errorf("%w: lease %s could not be renewed for %s (%v)", ErrLost, lease.Name, time.Since(l.renewed).Round(time.Second), err))
		}
		return // tried again at the next tick
	}
	l.renewed = sent
}

// lose gives the leases up for lost: they are no longer renewed nor
// touched, and the holder is told why.
func (l *Set) lose(err error) {
	l.lostErr = err
	l.stop()
	if l.Lost != nil {
		l.Lost(err)
	}
}

func (l *Set) stopRenewing() {
	if l.stop != nil {
		l.stop()
		l.done.Wait()
	}
}

// Release deletes the leases: the migration ended for good.
func (l *Set) Release(ctx context.Context) {
	if l == nil {
		return
	}
	l.stopRenewing()
	if l.lostErr == nil {
		for _, lease := range l.held {
			_ = l.deleteOwn(ctx, lease)
		}
	}
	l.held = nil
}

// deleteOwn deletes lease while it is still this migration's (its UID, this
// migration its holder). The held copy can be older than the API server's:
// a renewal that reached it after the renewer stopped waiting. And a busy
// API server fails calls that a second try gets through. Either left the
// lease behind, blocking the pod's next migration for a lease duration.
func (l *Set) deleteOwn(ctx context.Context, lease *coordinationv1.Lease) error {
	api := l.Client.CoordinationV1().Leases(l.Namespace)
	current := lease
	retriable := func(err error) bool { return ctx.Err() == nil && !apierrors.IsForbidden(err) }
	return retry.OnError(retry.DefaultBackoff, retriable, func() error {
		err := api.Delete(ctx, current.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &current.UID, ResourceVersion: &current.ResourceVersion}})
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return err
		}
		fresh, getErr := api.Get(ctx, current.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(getErr):
			return nil
		case getErr != nil:
			return getErr
		case fresh.UID != lease.UID || ptr.Deref(fresh.Spec.HolderIdentity, "") != l.ID:
			return nil // another migration's lease now
		}
		current = fresh
		return err
	})
}

// Abandon stops renewing and marks the leases as given up, so the next
// migration of the pod is told at once to recover this one, and its
// recovery need not wait them out.
func (l *Set) Abandon(ctx context.Context) {
	if l == nil {
		return
	}
	l.stopRenewing()
	if l.lostErr == nil {
		for _, lease := range l.held {
			next := lease.DeepCopy()
			next.Spec.LeaseDurationSeconds = ptr.To(int32(abandonedSeconds))
			_, _ = l.Client.CoordinationV1().Leases(l.Namespace).Update(ctx, next, metav1.UpdateOptions{})
		}
	}
	l.held = nil
}

// ReleaseStale deletes the leases of migration id once nobody renews
// them any more (waiting a lease duration to see that, unless their holder
// is known to have ended), for a migration that stopped before it changed
// anything (and so left no journal). It returns how many it deleted.
func ReleaseStale(ctx context.Context, client kubernetes.Interface, namespace, id string) (int, error) {
	list, err := client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: MigrationLabel + "=" + id})
	if err != nil {
		return 0, fmt.Errorf("list the leases of migration %s: %w", id, err)
	}
	n := 0
	for _, l := range list.Items {
		last := &l
		if !holderEnded(last) {
			if last, err = awaitExpiry(ctx, client, last); err != nil {
				return n, fmt.Errorf("migration %s is still running on %s: %w; recover it only once that process has ended", id, l.Annotations[HostAnnotation], err)
			}
		}
		if err := client.CoordinationV1().Leases(namespace).Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &last.ResourceVersion}}); err != nil && !apierrors.IsNotFound(err) {
			return n, err
		}
		n++
	}
	return n, nil
}

// StillRunning reports whether the process running migration id on pod
// seems to renew its lease still, for display: it compares clocks, which a
// decision must not (see DrainEnded).
func StillRunning(ctx context.Context, client kubernetes.Interface, namespace, pod, id string) bool {
	return leaseSeemsHeld(ctx, client, namespace, Name("pod", pod), id)
}

// DrainStillRunning is StillRunning for drain id of node.
func DrainStillRunning(ctx context.Context, client kubernetes.Interface, namespace, node, id string) bool {
	return leaseSeemsHeld(ctx, client, namespace, Name("node", node), id)
}

// DrainEnded returns nil once the process running drain id of node no
// longer renews the node's lease (it may wait a lease duration to see that).
func DrainEnded(ctx context.Context, client kubernetes.Interface, namespace, node, id string) error {
	l, err := client.CoordinationV1().Leases(namespace).Get(ctx, Name("node", node), metav1.GetOptions{})
	if apierrors.IsNotFound(err) || err == nil && (ptr.Deref(l.Spec.HolderIdentity, "") != id || holderEnded(l)) {
		return nil
	}
	if err == nil {
		_, err = awaitExpiry(ctx, client, l)
	}
	if err != nil {
		return fmt.Errorf("drain %s of %s is still running: %w; recover it only once that process has ended", id, node, err)
	}
	return nil
}

func leaseSeemsHeld(ctx context.Context, client kubernetes.Interface, namespace, name, id string) bool {
	l, err := client.CoordinationV1().Leases(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != id || holderEnded(l) {
		return false
	}
	d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	return time.Now().Before(renewTime(l).Add(d))
}

// Holder returns the migration that holds the lease on pod, if any.
func Holder(ctx context.Context, client kubernetes.Interface, namespace, pod string) (string, bool) {
	l, err := client.CoordinationV1().Leases(namespace).Get(ctx, Name("pod", pod), metav1.GetOptions{})
	if err != nil {
		return "", false
	}
	id := ptr.Deref(l.Spec.HolderIdentity, "")
	return id, id != ""
}
