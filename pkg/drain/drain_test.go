package drain

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/agent"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate/migratetest"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

func node(name string, cpu string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("8Gi")},
		},
	}
}

// pod is a running MS2M pod on node-a requesting cpu; mutate adjusts it.
func pod(name, cpu string, mutate ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps", Labels: map[string]string{"app": name},
			Annotations: map[string]string{migrate.QueueAnnotation: name + ".work"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func ownedBy(kind, name string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: name, Controller: ptr.To(true), APIVersion: "apps/v1"}}
	}
}

func TestPlan(t *testing.T) {
	gpuTaint := corev1.Taint{Key: "gpu", Value: "yes", Effect: corev1.TaintEffectNoSchedule}
	client := fake.NewClientset(
		node("node-a", "4", nil), node("node-b", "2", map[string]string{"zone": "b"}), node("node-c", "8", map[string]string{"zone": "c"}, gpuTaint),
		pod("bare", "500m"),
		pod("db-0", "500m", ownedBy("StatefulSet", "db")),
		pod("web-1", "100m", ownedBy("ReplicaSet", "web"), func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{"zone": "c"}
			p.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
		}),
		pod("batch-1", "100m", ownedBy("Job", "batch")),
		pod("logs", "100m", ownedBy("DaemonSet", "logs")),
		// Without the MS2M contract: it moves with checkpoint/restore.
		pod("plain", "100m", func(p *corev1.Pod) {
			p.Annotations = nil
			p.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
		}),
		pod("cache", "100m", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "cache", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/cache"}}}}
		}),
		// An emptyDir's data moves with its pod.
		pod("scratch", "100m", func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			p.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
		}),
		pod("gpu-only", "100m", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"zone": "c"} }),
		pod("gpu-ok", "100m", func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{"zone": "c"}
			p.Spec.Tolerations = []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpExists}}
		}),
		pod("huge", "3", func(p *corev1.Pod) { p.Spec.Tolerations = nil }),
		// What ties a process to its node, or holds state CRIU cannot dump.
		pod("proxy", "100m", func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		pod("trainer", "100m", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		}),
		// The agents' controller: the drain's own moves need it.
		pod("controller", "100m", ownedBy("ReplicaSet", "kubectl-migrate-controller-5f"), func(p *corev1.Pod) {
			p.Namespace, p.Annotations = "kubectl-migrate-system", nil
			p.Labels = map[string]string{"app.kubernetes.io/name": agent.ControllerName}
		}),
		// Already on node-b, taking room there.
		pod("other", "1", func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }),
		&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "apps"},
			Spec: policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db-0"}}}},
	)
	plan, err := MakePlan(context.Background(), client, "node-a", PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	moves := map[string]Move{}
	for _, m := range plan.Moves {
		moves[m.Pod.Name] = m
	}
	// node-b has 1 CPU left, node-c (tainted) 8: bare and db-0 fit only on
	// node-b, 500m each; gpu-ok and a Deployment's web-1 go to node-c; huge
	// fits nowhere.
	for name, want := range map[string]string{"bare": "node-b", "db-0": "node-b", "gpu-ok": "node-c", "web-1": "node-c", "plain": "node-c"} {
		if moves[name].Target != want {
			t.Errorf("%s → %q, want %s", name, moves[name].Target, want)
		}
	}
	if moves["scratch"].Target == "" {
		t.Error("the pod with an emptyDir was not planned")
	}
	if moves["db-0"].StatefulSet != "db" || len(moves["db-0"].Budgets) != 1 || moves["bare"].StatefulSet != "" || moves["web-1"].StatefulSet != "" {
		t.Errorf("db-0 %+v, bare %+v, web-1 %+v", moves["db-0"], moves["bare"], moves["web-1"])
	}
	skipped := map[string]Skip{}
	for _, s := range plan.Skipped {
		skipped[s.Pod] = s
	}
	for name, want := range map[string]string{
		"batch-1": "controlled by Job batch", "logs": "DaemonSet",
		"cache": "hostPath", "gpu-only": "taint gpu=yes:NoSchedule", "huge": "no node fits",
		"proxy": "hostNetwork", "trainer": "the device nvidia.com/gpu",
		"controller": "the agents' controller",
	} {
		if !strings.Contains(skipped[name].Reason, want) {
			t.Errorf("%s skipped for %q, want %q", name, skipped[name].Reason, want)
		}
	}
	if skipped["logs"].Evictable || !skipped["batch-1"].Evictable || !skipped["controller"].Evictable {
		t.Errorf("evictable: logs %v, batch-1 %v, controller %v", skipped["logs"].Evictable, skipped["batch-1"].Evictable, skipped["controller"].Evictable)
	}
	if len(plan.Moves)+len(plan.Skipped) != 14 {
		t.Errorf("%d moves and %d skipped, want 14 pods in all", len(plan.Moves), len(plan.Skipped))
	}
}

func TestPlanRefusesBadTargets(t *testing.T) {
	client := fake.NewClientset(node("node-a", "4", nil), node("node-b", "4", nil))
	for _, tc := range []struct {
		o    PlanOptions
		want string
	}{
		{PlanOptions{Targets: []string{"node-z"}}, "node node-z (--to) not found"},
		{PlanOptions{Targets: []string{"node-a"}}, "is the node being drained"},
	} {
		if _, err := MakePlan(context.Background(), client, "node-a", tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
	if _, err := MakePlan(context.Background(), client, "node-q", PlanOptions{}); err == nil || !strings.Contains(err.Error(), "node node-q not found") {
		t.Errorf("unknown node: %v", err)
	}
}

// fakeMigrations records how many run at once, overall and per group.
type fakeMigrations struct {
	mu       sync.Mutex
	running  map[string]int // by StatefulSet or budget
	now, max int
	maxOf    map[string]int
	fail     map[string]bool
	refuse   map[string]bool
	ids      atomic.Int32
}

func (f *fakeMigrations) migrate(ctx context.Context, mv Move, id string) (*report.Record, error) {
	keys := append([]string{"sts:" + mv.StatefulSet, "chain:" + mv.chainKey()}, mv.Budgets...)
	f.mu.Lock()
	f.now++
	f.max = max(f.max, f.now)
	for _, k := range keys {
		f.running[k]++
		f.maxOf[k] = max(f.maxOf[k], f.running[k])
	}
	f.mu.Unlock()
	select {
	case <-time.After(200 * time.Millisecond): // overlap (saving the record takes a while), so limits are tested
	case <-ctx.Done():
	}
	f.mu.Lock()
	f.now--
	for _, k := range keys {
		f.running[k]--
	}
	f.mu.Unlock()
	if f.refuse[mv.Pod.Name] { // as migrate.Run returns a preflight refusal
		return &report.Record{ID: id, Outcome: report.Running}, errors.New("preflight: PersistentVolumeClaim data is bound to a local volume")
	}
	if f.fail[mv.Pod.Name] || ctx.Err() != nil {
		return &report.Record{ID: id, Outcome: report.RolledBack}, errors.New("rolled back")
	}
	return &report.Record{ID: id, Outcome: report.Succeeded, TotalMillis: 20, Downtime: &report.Downtime{Millis: 1}}, nil
}

func newFake() *fakeMigrations {
	return &fakeMigrations{running: map[string]int{}, maxOf: map[string]int{}, fail: map[string]bool{}, refuse: map[string]bool{}}
}

func (f *fakeMigrations) deps(client *fake.Clientset) Deps {
	return Deps{Client: client, Records: report.Store{Client: client}, Migrate: f.migrate,
		NewID: func() string { return fmt.Sprintf("m%d", f.ids.Add(1)) }}
}

func drainWorld(extra ...runtime.Object) *fake.Clientset {
	objs := []runtime.Object{node("node-a", "16", nil), node("node-b", "16", nil)}
	for i := range 3 {
		objs = append(objs, pod(fmt.Sprintf("db-%d", i), "100m", ownedBy("StatefulSet", "db"), func(p *corev1.Pod) { p.Labels["tier"] = "db" }))
	}
	for i := range 4 {
		objs = append(objs, pod(fmt.Sprintf("bare-%d", i), "100m", func(p *corev1.Pod) { p.Labels["tier"] = "bare" }))
	}
	return fake.NewClientset(append(objs, extra...)...)
}

// The limits hold: parallel overall, one ordinal of a StatefulSet at a
// time, one pod of a ReplicaSet at a time, a budget's allowance; the node
// ends cordoned and every move is in the record.
func TestRunKeepsTheLimits(t *testing.T) {
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "apps"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "bare"}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 2}}
	client := drainWorld(pdb, pod("web-0", "100m", ownedBy("ReplicaSet", "web")), pod("web-1", "100m", ownedBy("ReplicaSet", "web")))
	plan, err := MakePlan(context.Background(), client, "node-a", PlanOptions{})
	if err != nil || len(plan.Moves) != 9 {
		t.Fatalf("plan %v: %+v", err, plan)
	}
	f := newFake()
	var started atomic.Int32
	rec, err := Run(context.Background(), Config{ID: "d1", Namespace: "default", Parallel: 3}, f.deps(client), plan,
		Hooks{Started: func(Move, string) { started.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if f.max > 3 || f.maxOf["sts:db"] != 1 || f.maxOf["chain:apps/rs/web"] != 1 || f.maxOf["apps/bare"] > 2 || f.max < 2 {
		t.Fatalf("at once: %d overall, %d of db, %d of web, %d of the budget", f.max, f.maxOf["sts:db"], f.maxOf["chain:apps/rs/web"], f.maxOf["apps/bare"])
	}
	if rec.Outcome != report.Succeeded || started.Load() != 9 || len(rec.Drain.Moves) != 9 {
		t.Fatalf("record %+v", rec)
	}
	for _, m := range rec.Drain.Moves {
		if m.Migration == "" || m.Outcome != report.Succeeded || m.DowntimeMillis != 1 {
			t.Fatalf("move %+v", m)
		}
	}
	n, _ := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if !n.Spec.Unschedulable {
		t.Fatal("node-a is not cordoned after the drain")
	}
	saved, err := report.Store{Client: client}.Get(context.Background(), "default", "d1")
	if err != nil || saved.Drain == nil || saved.Outcome != report.Succeeded {
		t.Fatalf("saved drain record %v: %+v", err, saved)
	}
	leases, _ := client.CoordinationV1().Leases("default").List(context.Background(), metav1.ListOptions{})
	if len(leases.Items) != 0 {
		t.Fatal("the drain's lease is left")
	}
}

// A StatefulSet's ordinals move one after another, so that chain goes
// first (one at a time here, to see the order).
func TestRunStartsTheLongestChainFirst(t *testing.T) {
	client := drainWorld()
	plan, _ := MakePlan(context.Background(), client, "node-a", PlanOptions{})
	var order []string
	_, err := Run(context.Background(), Config{ID: "d4", Namespace: "default", Parallel: 1}, newFake().deps(client), plan,
		Hooks{Started: func(mv Move, _ string) { order = append(order, mv.Pod.Name) }})
	if err != nil || strings.Join(order, " ") != "db-0 db-1 db-2 bare-0 bare-1 bare-2 bare-3" {
		t.Fatalf("%v: order %v", err, order)
	}
}

// A failed move does not stop the others; with FailFast it does, and the
// node, cordoned by the drain, is uncordoned.
func TestRunFailures(t *testing.T) {
	for _, failFast := range []bool{false, true} {
		client := drainWorld()
		plan, _ := MakePlan(context.Background(), client, "node-a", PlanOptions{})
		f := newFake()
		f.fail["bare-0"] = true
		f.refuse["bare-1"] = !failFast
		rec, err := Run(context.Background(), Config{ID: "d2", Namespace: "default", Parallel: 1, FailFast: failFast}, f.deps(client), plan, Hooks{})
		if err == nil || !strings.Contains(err.Error(), "apps/bare-0 (rolled-back)") || rec.Outcome != report.Failed {
			t.Fatalf("fail-fast %v: %v, %s", failFast, err, rec.Outcome)
		}
		counts := map[report.Outcome]int{}
		for _, m := range rec.Drain.Moves {
			counts[m.Outcome]++
		}
		n, _ := client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		if !failFast && (counts[report.Succeeded] != 5 || counts[report.RolledBack] != 2 || !n.Spec.Unschedulable) {
			t.Fatalf("without fail-fast: %v, cordoned %v", counts, n.Spec.Unschedulable)
		}
		if failFast && (counts[report.NotStarted] == 0 || n.Spec.Unschedulable || !rec.Drain.Uncordoned) {
			t.Fatalf("with fail-fast: %v, cordoned %v", counts, n.Spec.Unschedulable)
		}
	}
}

// A budget that allows no disruption holds its pods back, named, while the
// rest move.
func TestRunBudgetAllowingNothing(t *testing.T) {
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "strict", Namespace: "apps"},
		Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "db"}}}}
	client := drainWorld(pdb)
	plan, _ := MakePlan(context.Background(), client, "node-a", PlanOptions{})
	rec, err := Run(context.Background(), Config{ID: "d3", Namespace: "default", Parallel: 2}, newFake().deps(client), plan, Hooks{})
	if err == nil {
		t.Fatal("a drain that left pods behind succeeded")
	}
	for _, m := range rec.Drain.Moves {
		isDB := strings.HasPrefix(m.Pod, "db-")
		if isDB && (m.Outcome != report.Failed || !strings.Contains(m.Error, "apps/strict allows no disruption")) || !isDB && m.Outcome != report.Succeeded {
			t.Fatalf("move %+v", m)
		}
	}
}

// TestDrainChecksEveryCallItMakes records every request a drain makes of
// the API server (plan, cordon, budgets, record, lock, evictions) and fails
// on one its permission check does not cover in that namespace: a caller
// short of an access must hear it before the node is cordoned.
func TestDrainChecksEveryCallItMakes(t *testing.T) {
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "apps"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "bare"}}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 5}}
	batch := pod("batch-1", "100m", ownedBy("Job", "batch"), func(p *corev1.Pod) { p.Namespace = "frontend" })
	cluster := drainWorld(pdb, batch)
	cluster.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		// The API server deletes an evicted pod.
		ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		return true, nil, cluster.Tracker().Delete(corev1.SchemeGroupVersion.WithResource("pods"), ev.Namespace, ev.Name)
	})
	client, calls := migratetest.Recording(cluster)
	cfg := Config{ID: "d1", Namespace: "ops", Parallel: 2, EvictRest: true}
	plan, err := MakePlan(context.Background(), client, "node-a", PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(plan.Skipped, func(s Skip) bool { return s.Evictable }) {
		t.Fatalf("nothing to evict in %+v", plan.Skipped)
	}
	if _, err := Run(context.Background(), cfg, newFake().deps(client), plan, Hooks{}); err != nil {
		t.Fatal(err)
	}
	needed := NeededPermissions(cfg, plan)
	covers := func(ns string, c migratetest.APICall) bool {
		return slices.ContainsFunc(needed[ns], func(p migrate.Permission) bool {
			return p.Group == c.Group && p.Verb == c.Verb && p.Resource == c.Resource && p.Subresource == c.Subresource
		})
	}
	recorded := calls()
	if len(recorded) < 10 {
		t.Fatalf("recorded only %d calls", len(recorded))
	}
	for _, c := range recorded {
		if !covers(c.Namespace, c) && !covers("", c) { // "" holds the cluster-wide ones
			t.Errorf("the drain calls %s %s/%s (group %q) in namespace %q, which its check does not cover", c.Verb, c.Resource, c.Subresource, c.Group, c.Namespace)
		}
	}
}

// TestDocumentedRBACGrantsWhatADrainChecks: docs/rbac.yaml grants every
// access a drain checks for: its own in the drain role (bound cluster-wide)
// or, for its record and lock, the namespaced role; its migrations' as
// migrate's test proves.
func TestDocumentedRBACGrantsWhatADrainChecks(t *testing.T) {
	grants := migratetest.DocumentedRoles(t, "../../docs/rbac.yaml")
	batch := pod("batch-1", "100m", ownedBy("Job", "batch"))
	plan, err := MakePlan(context.Background(), drainWorld(batch), "node-a", PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	migrations := migrate.NeededPermissions(migrate.Config{StatefulSet: "any", RegistrySecret: "any"})
	for ns, perms := range NeededPermissions(Config{Namespace: "ops", EvictRest: true}, plan) {
		for _, p := range perms {
			switch {
			case slices.Contains(migrations, p):
			case ns == "ops" && grants("kubectl-migrate", p):
			case !grants("kubectl-migrate-drain", p):
				t.Errorf("docs/rbac.yaml's kubectl-migrate-drain does not grant %s %s (needed in %q)", p.Verb, p.QualifiedResource(), ns)
			}
		}
	}
}
