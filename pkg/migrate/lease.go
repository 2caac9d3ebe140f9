package migrate

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
	"k8s.io/utils/ptr"
)

// One migration at a time: a migration holds a coordination.k8s.io Lease on
// its pod and, for a StatefulSet pod, one on its StatefulSet (two ordinals
// must not race the StatefulSet's delete and re-create). The holder renews
// them while it runs. A migration that did not end for good (its process
// died, or its rollback stopped) leaves them un-renewed: they are never
// taken over by another migration, only by the recovery of the same one.
const (
	leaseDuration = 20 * time.Second
	leaseRenew    = 5 * time.Second
	// HostAnnotation names the machine and process holding a lease.
	HostAnnotation = "migrate.ms2m.io/host"
)

// LeaseName is the lease of a pod ("pod") or a StatefulSet ("sts").
func LeaseName(kind, name string) string { return "kubectl-migrate-" + kind + "-" + name }

// leases are the leases one migration holds.
type leases struct {
	client    kubernetes.Interface
	namespace string
	id        string

	mu   sync.Mutex
	held []*coordinationv1.Lease
	stop context.CancelFunc
	done sync.WaitGroup
}

// errLeaseHeld is returned when another migration holds a lease.
var errLeaseHeld = errors.New("held by another migration")

// acquireLeases takes the migration's leases, or only checks that nobody
// else holds them (dry run). With recovering, it takes over leases that
// this same migration left un-renewed.
func (m *Migration) acquireLeases(ctx context.Context, recovering bool) error {
	names := []string{LeaseName("pod", m.Pod)}
	what := []string{"pod " + m.Pod}
	if m.StatefulSet != "" {
		names = append(names, LeaseName("sts", m.StatefulSet))
		what = append(what, "StatefulSet "+m.StatefulSet)
	}
	l := &leases{client: m.Client, namespace: m.Namespace, id: m.ID}
	for i, name := range names {
		if err := l.acquire(ctx, name, what[i], m.DryRun, recovering); err != nil {
			l.release(context.WithoutCancel(ctx))
			return err
		}
	}
	l.startRenewing()
	m.leases = l
	return nil
}

func (l *leases) acquire(ctx context.Context, name, what string, checkOnly, recovering bool) error {
	leasesAPI := l.client.CoordinationV1().Leases(l.namespace)
	now := metav1.NewMicroTime(time.Now())
	host, _ := os.Hostname()
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: l.namespace,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "kubectl-migrate", MigrationLabel: l.id},
			Annotations: map[string]string{HostAnnotation: fmt.Sprintf("%s pid %d", host, os.Getpid())}},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(l.id), LeaseDurationSeconds: ptr.To(int32(leaseDuration.Seconds())),
			AcquireTime: &now, RenewTime: &now,
		},
	}
	existing, err := leasesAPI.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if checkOnly {
			return nil
		}
		created, err := leasesAPI.Create(ctx, lease, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("%s: another migration took it a moment ago; see kubectl migrate report", what)
		}
		if err != nil {
			return fmt.Errorf("take lease %s on %s (needs create on leases.coordination.k8s.io): %w", name, what, err)
		}
		l.held = append(l.held, created)
		return nil
	case err != nil:
		return fmt.Errorf("read lease %s on %s: %w", name, what, err)
	}
	holder := ptr.Deref(existing.Spec.HolderIdentity, "")
	fresh := leaseFresh(existing, time.Now()) && !holderGone(existing.Annotations[HostAnnotation])
	switch {
	case holder != l.id && fresh:
		return fmt.Errorf("%s is being migrated by migration %s (%s, renewed %s ago): %w; wait for it to end, or follow it with kubectl migrate report %s",
			what, holder, existing.Annotations[HostAnnotation], renewedAgo(existing), errLeaseHeld, holder)
	case holder != l.id:
		return fmt.Errorf("%s is held by migration %s, which did not end (last renewed %s ago by %s): %w; finish or undo it first: %s",
			what, holder, renewedAgo(existing), existing.Annotations[HostAnnotation], errLeaseHeld, RecoverCommand(l.namespace, holder))
	case fresh:
		return fmt.Errorf("migration %s is still running on %s (renewed %s ago); recover it only once that process has ended", l.id, existing.Annotations[HostAnnotation], renewedAgo(existing))
	case !recovering || checkOnly:
		return fmt.Errorf("%s: lease %s names this migration already: %w", what, name, errLeaseHeld)
	}
	lease.ResourceVersion = existing.ResourceVersion
	updated, err := leasesAPI.Update(ctx, lease, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("take over lease %s on %s: %w", name, what, err)
	}
	l.held = append(l.held, updated)
	return nil
}

func leaseFresh(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil {
		return false
	}
	d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	return now.Before(l.Spec.RenewTime.Add(d))
}

func renewedAgo(l *coordinationv1.Lease) time.Duration {
	if l.Spec.RenewTime == nil {
		return 0
	}
	return time.Since(l.Spec.RenewTime.Time).Round(time.Second)
}

// Lock takes the lease name (see LeaseName) in namespace for id, naming what
// it guards in refusals, and renews it until release is called; a drain
// holds its node's this way while its migrations take their pods' leases.
func Lock(ctx context.Context, client kubernetes.Interface, namespace, id, name, what string) (release func(context.Context), err error) {
	l := &leases{client: client, namespace: namespace, id: id}
	if err := l.acquire(ctx, name, what, false, false); err != nil {
		return nil, err
	}
	l.startRenewing()
	return l.release, nil
}

// startRenewing renews the held leases until release or abandon.
func (l *leases) startRenewing() {
	if len(l.held) == 0 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		wait.UntilWithContext(ctx, func(ctx context.Context) { l.update(ctx, leaseDuration) }, leaseRenew)
	}()
}

// update renews every held lease for d.
func (l *leases) update(ctx context.Context, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, lease := range l.held {
		next := lease.DeepCopy()
		next.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		next.Spec.LeaseDurationSeconds = ptr.To(int32(d.Seconds()))
		if updated, err := l.client.CoordinationV1().Leases(l.namespace).Update(ctx, next, metav1.UpdateOptions{}); err == nil {
			l.held[i] = updated
		}
	}
}

func (l *leases) stopRenewing() {
	if l.stop != nil {
		l.stop()
		l.done.Wait()
	}
}

// release deletes the leases: the migration ended for good.
func (l *leases) release(ctx context.Context) {
	if l == nil {
		return
	}
	l.stopRenewing()
	for _, lease := range l.held {
		_ = l.client.CoordinationV1().Leases(l.namespace).Delete(ctx, lease.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &lease.UID}})
	}
	l.held = nil
}

// abandon stops renewing and marks the leases expired at once, so the next
// migration of the pod is told at once to recover this one.
func (l *leases) abandon(ctx context.Context) {
	if l == nil {
		return
	}
	l.stopRenewing()
	l.update(ctx, time.Second)
	l.held = nil
}

// ReleaseStaleLeases deletes the leases of migration id that nobody renews
// any more, for a migration that stopped before it changed anything (and so
// left no journal). It returns how many it deleted.
func ReleaseStaleLeases(ctx context.Context, client kubernetes.Interface, namespace, id string) (int, error) {
	list, err := client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: MigrationLabel + "=" + id})
	if err != nil {
		return 0, fmt.Errorf("list the leases of migration %s: %w", id, err)
	}
	n := 0
	for _, l := range list.Items {
		if leaseFresh(&l, time.Now()) && !holderGone(l.Annotations[HostAnnotation]) {
			return n, fmt.Errorf("migration %s is still running on %s (renewed %s ago); recover it only once that process has ended", id, l.Annotations[HostAnnotation], renewedAgo(&l))
		}
		if err := client.CoordinationV1().Leases(namespace).Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return n, err
		}
		n++
	}
	return n, nil
}

// StillRunning reports whether the process running migration id on pod
// still renews its lease.
func StillRunning(ctx context.Context, client kubernetes.Interface, namespace, pod, id string) bool {
	return leaseHeldBy(ctx, client, namespace, LeaseName("pod", pod), id)
}

// DrainStillRunning reports whether drain id of node still runs (its
// process renews the node's lease).
func DrainStillRunning(ctx context.Context, client kubernetes.Interface, namespace, node, id string) bool {
	return leaseHeldBy(ctx, client, namespace, LeaseName("node", node), id)
}

func leaseHeldBy(ctx context.Context, client kubernetes.Interface, namespace, name, id string) bool {
	l, err := client.CoordinationV1().Leases(namespace).Get(ctx, name, metav1.GetOptions{})
	return err == nil && ptr.Deref(l.Spec.HolderIdentity, "") == id && leaseFresh(l, time.Now()) && !holderGone(l.Annotations[HostAnnotation])
}

// Holder returns the migration that holds the lease on pod, if any.
func Holder(ctx context.Context, client kubernetes.Interface, namespace, pod string) (string, bool) {
	l, err := client.CoordinationV1().Leases(namespace).Get(ctx, LeaseName("pod", pod), metav1.GetOptions{})
	if err != nil {
		return "", false
	}
	id := ptr.Deref(l.Spec.HolderIdentity, "")
	return id, id != ""
}
