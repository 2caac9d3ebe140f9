package drain

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/lease"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// Config is how to drain.
type Config struct {
	ID string
	// Namespace keeps the drain's record and lease.
	Namespace string
	// Parallel migrations at once (≥ 1).
	Parallel int
	// FailFast stops starting migrations after the first that fails.
	FailFast bool
	// KeepCordoned leaves the node cordoned when the drain stops early.
	KeepCordoned bool
	// EvictRest hands the pods that did not move to the eviction API.
	EvictRest bool
	// Targets names the target nodes for the record ("" = any).
	Targets string
	// AgentNamespace is where the moves' agents run ("" for
	// agent.DefaultNamespace).
	AgentNamespace string
	// RegistrySecret is the one the moves push with ("" for each pod's
	// first pull secret).
	RegistrySecret string
}

// migration is what mv's migration needs access for.
func (c Config) migration(mv Move) migrate.Config {
	secret := c.RegistrySecret
	if secret == "" && len(mv.Pod.Spec.ImagePullSecrets) > 0 {
		secret = mv.Pod.Spec.ImagePullSecrets[0].Name
	}
	return migrate.Config{Namespace: mv.Pod.Namespace, StatefulSet: mv.StatefulSet, AgentNamespace: c.AgentNamespace, RegistrySecret: secret}
}

// Deps are what a drain drives.
type Deps struct {
	Client  kubernetes.Interface
	Records migrate.RecordStore
	// Migrate runs one move as migration id and returns its record (the
	// single-pod engine, configured by the caller from the pod's
	// annotations and the drain's flags).
	Migrate func(ctx context.Context, mv Move, id string) (*report.Record, error)
	// NewID names a move's migration.
	NewID func() string
}

// Hooks show progress; either may be nil.
type Hooks struct {
	Started  func(mv Move, id string)
	Finished func(mv Move, result report.DrainMove)
}

// drainer is one drain in progress.
type drainer struct {
	cfg   Config
	deps  Deps
	hooks Hooks
	plan  Plan

	mu  sync.Mutex
	rec *report.Record
}

// Run drains plan's node: it takes the node's lease, cordons the node, runs
// the moves (cfg.Parallel at once, never two pods of one StatefulSet or
// ReplicaSet and never more of a PodDisruptionBudget's pods than it allows
// at the start),
// and saves the drain's record as it goes. A failed move was rolled back by
// its migration; the drain goes on unless FailFast. If ctx ends, running
// migrations roll back (or leave their journals) and the rest do not start.
// A drain that stops early uncordons the node (unless KeepCordoned or it was
// cordoned before).
func Run(ctx context.Context, cfg Config, deps Deps, plan Plan, hooks Hooks) (*report.Record, error) {
	if cfg.Parallel < 1 {
		cfg.Parallel = 1
	}
	// A drain that loses its node's lock starts no more moves.
	ctx, lockLost := context.WithCancelCause(ctx)
	defer lockLost(nil)
	release, err := lease.Lock(ctx, deps.Client, cfg.Namespace, cfg.ID, lease.Name("node", plan.Node), "node "+plan.Node, lockLost)
	if err != nil {
		return nil, err
	}
	defer release(context.WithoutCancel(ctx))
	d := &drainer{cfg: cfg, deps: deps, hooks: hooks, plan: plan, rec: &report.Record{
		ID: cfg.ID, Strategy: report.DrainStrategy, Namespace: cfg.Namespace, Pod: plan.Node,
		SourceNode: plan.Node, TargetNode: cfg.Targets, StartedAt: time.Now().UTC(), Outcome: report.Running,
		Drain: &report.Drain{},
	}}
	for _, mv := range plan.Moves {
		d.rec.Drain.Moves = append(d.rec.Drain.Moves, report.DrainMove{Namespace: mv.Pod.Namespace, Pod: mv.Pod.Name, StatefulSet: mv.StatefulSet, Target: mv.Target, Outcome: report.NotStarted})
	}
	for _, s := range plan.Skipped {
		d.rec.Drain.Skipped = append(d.rec.Drain.Skipped, report.DrainSkip{Namespace: s.Namespace, Pod: s.Pod, Reason: s.Reason})
	}
	if err := d.save(ctx); err != nil {
		return nil, err
	}
	wasCordoned, err := SetCordon(ctx, deps.Client, plan.Node, true)
	if err != nil {
		d.finish(ctx, err)
		return d.rec, err
	}
	stoppedEarly := d.runMoves(ctx)
	var errs []error
	if stoppedEarly && !cfg.KeepCordoned && !wasCordoned {
		_, err := SetCordon(context.WithoutCancel(ctx), deps.Client, plan.Node, false)
		errs = append(errs, err)
		d.rec.Drain.Uncordoned = err == nil
	}
	if cfg.EvictRest && !stoppedEarly {
		errs = append(errs, d.evictRest(ctx))
	}
	err = errors.Join(errs...)
	d.finish(context.WithoutCancel(ctx), err)
	return d.rec, d.outcomeError(err)
}

// runMoves runs the moves under the limits; it reports whether it stopped
// before trying them all.
func (d *drainer) runMoves(ctx context.Context) (stoppedEarly bool) {
	limits, err := budgetLimits(ctx, d.deps.Client, d.plan.Moves)
	if err != nil {
		d.rec.Error = err.Error()
		return true
	}
	s := newScheduler(d.plan.Moves, limits)
	index := map[string]int{}
	for i, mv := range d.plan.Moves {
		index[mv.Name()] = i
	}
	// A cancelled context must wake the waiting workers.
	stopWaking := context.AfterFunc(ctx, s.wake)
	defer stopWaking()
	var wg sync.WaitGroup
	for range d.cfg.Parallel {
		wg.Go(func() {
			for {
				mv, ok := s.next(ctx)
				if !ok {
					return
				}
				failed := !d.move(ctx, mv, index[mv.Name()])
				s.done(mv, failed && d.cfg.FailFast)
			}
		})
	}
	wg.Wait()
	for _, mv := range s.held {
		d.update(ctx, index[mv.Name()], func(m *report.DrainMove) {
			m.Outcome, m.Error = report.Failed, "its PodDisruptionBudget "+strings.Join(mv.Budgets, ", ")+" allows no disruption now; not migrated"
		})
	}
	return s.stoppedEarly(ctx)
}

// chainKey groups the moves that must run one after another: a
// StatefulSet's pods, and a ReplicaSet's, whose count is one over while a
// copy is adopted and which a migration refuses to start on while its count
// is off (a bare pod is a chain of its own).
func (m Move) chainKey() string {
	if m.StatefulSet != "" {
		return m.Pod.Namespace + "/sts/" + m.StatefulSet
	}
	if owner := metav1.GetControllerOf(m.Pod); owner != nil && owner.Kind == "ReplicaSet" {
		return m.Pod.Namespace + "/rs/" + owner.Name
	}
	return m.Name()
}

// move runs one migration and records its outcome; it reports success.
func (d *drainer) move(ctx context.Context, mv Move, i int) bool {
	id := d.deps.NewID()
	d.update(ctx, i, func(m *report.DrainMove) { m.Migration, m.Outcome = id, report.Running })
	if d.hooks.Started != nil {
		d.hooks.Started(mv, id)
	}
	rec, err := d.deps.Migrate(ctx, mv, id)
	var result report.DrainMove
	d.update(ctx, i, func(m *report.DrainMove) {
		m.Outcome = report.Failed
		if rec != nil {
			m.Outcome, m.TotalMillis = rec.Outcome, rec.TotalMillis
			if rec.Downtime != nil {
				m.DowntimeMillis = rec.Downtime.Millis
			}
		}
		if m.Outcome == report.Running && err != nil {
			// Refused in preflight (a claim on a local volume, say): nothing
			// changed and the pod serves where it was.
			m.Outcome = report.RolledBack
		}
		if err != nil {
			m.Error = err.Error()
		}
		result = *m
	})
	if d.hooks.Finished != nil {
		d.hooks.Finished(mv, result)
	}
	return err == nil && result.Outcome == report.Succeeded
}

// update changes move i of the record and saves it; a save that fails is
// not fatal to the drain (each migration keeps its own record).
func (d *drainer) update(ctx context.Context, i int, change func(*report.DrainMove)) {
	d.mu.Lock()
	change(&d.rec.Drain.Moves[i])
	d.mu.Unlock()
	_ = d.save(context.WithoutCancel(ctx))
}

func (d *drainer) save(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.deps.Records == nil {
		return nil
	}
	return d.deps.Records.Save(ctx, d.rec)
}

func (d *drainer) finish(ctx context.Context, err error) {
	d.mu.Lock()
	d.rec.Outcome = d.rec.Drain.Outcome()
	if err != nil {
		d.rec.Outcome = report.Failed
		d.rec.Error = strings.TrimSpace(strings.Join([]string{d.rec.Error, err.Error()}, " "))
	}
	d.rec.TotalMillis = time.Since(d.rec.StartedAt).Milliseconds()
	d.mu.Unlock()
	_ = d.save(ctx)
}

// outcomeError is the drain's error: err, or which moves did not succeed.
func (d *drainer) outcomeError(err error) error {
	var failed []string
	for _, m := range d.rec.Drain.Moves {
		if m.Outcome != report.Succeeded {
			failed = append(failed, m.Namespace+"/"+m.Pod+" ("+string(m.Outcome)+")")
		}
	}
	if len(failed) > 0 {
		err = errors.Join(err, fmt.Errorf("%d of %d pods did not move: %s", len(failed), len(d.rec.Drain.Moves), strings.Join(failed, ", ")))
	}
	return err
}

// budgetLimits reads how many disruptions each budget allows now.
func budgetLimits(ctx context.Context, client kubernetes.Interface, moves []Move) (map[string]int, error) {
	limits := map[string]int{}
	for _, mv := range moves {
		for _, b := range mv.Budgets {
			if _, ok := limits[b]; ok {
				continue
			}
			ns, name, _ := strings.Cut(b, "/")
			pdb, err := client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("read PodDisruptionBudget %s: %w", b, err)
			}
			limits[b] = int(pdb.Status.DisruptionsAllowed)
		}
	}
	return limits, nil
}

// SetCordon marks node unschedulable (or schedulable) and reports whether
// it already was.
func SetCordon(ctx context.Context, client kubernetes.Interface, node string, unschedulable bool) (bool, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("get node %s: %w", node, err)
	}
	was := n.Spec.Unschedulable
	if was == unschedulable {
		return was, nil
	}
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, unschedulable)
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return was, fmt.Errorf("cordon node %s (needs patch on nodes): %w", node, err)
	}
	return was, nil
}

// evictRest evicts what did not move, as kubectl drain does: pods that may
// be evicted and failed moves (rolled back, so still on the node), retrying
// while a budget refuses, and waits until they are gone.
func (d *drainer) evictRest(ctx context.Context) error {
	var names []types.NamespacedName
	for _, s := range d.plan.Skipped {
		if s.Evictable {
			names = append(names, types.NamespacedName{Namespace: s.Namespace, Name: s.Pod})
		}
	}
	for _, m := range d.rec.Drain.Moves {
		if m.Outcome == report.RolledBack || m.Outcome == report.NotStarted {
			names = append(names, types.NamespacedName{Namespace: m.Namespace, Name: m.Pod})
		}
	}
	var errs []error
	for _, n := range names {
		err := wait.PollUntilContextTimeout(ctx, 5*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			err := d.deps.Client.PolicyV1().Evictions(n.Namespace).Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: n.Namespace}})
			switch {
			case err == nil, apierrors.IsNotFound(err):
				return true, nil
			case apierrors.IsTooManyRequests(err): // a budget says not now
				return false, nil
			}
			return false, err
		})
		if err == nil {
			waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			_, err = kube.WaitForPod(waitCtx, d.deps.Client, n.Namespace, n.Name, gone)
			cancel()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("evict %s: %w", n, err))
			continue
		}
		d.mu.Lock()
		d.rec.Drain.Evicted = append(d.rec.Drain.Evicted, n.String())
		d.mu.Unlock()
	}
	return errors.Join(errs...)
}

func gone(p *corev1.Pod) (bool, error) { return p == nil, nil }
