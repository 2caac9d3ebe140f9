//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/drain"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/migrate"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
	"github.com/kubectl-migrate/kubectl-migrate/test/workload"
)

// redisServerCommand runs Debian's redis-server in memory only.
var redisServerCommand = []string{"/usr/bin/redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no"}

// TestCheckpointRestoreMovesRedis: kubectl migrate pod, given no strategy
// and no broker, moves Debian's redis-server while a client writes SET
// key_i i without pause. The client finds the server by its label, as a
// Service would (the lab has no kube-proxy), so it loses the server at the
// cut and reconnects to the copy once the labels move there. Afterwards
// every write Redis acknowledged is in the copy with its value, the copy is
// the same server (its run_id, an uptime that went on) and the client
// reconnected to it.
func TestCheckpointRestoreMovesRedis(t *testing.T) {
	concurrent(t)
	l := setup(t)
	l.restoresSomeWay(t)
	ns := l.startAnyPod(t, "redis", redisServerCommand...)
	// Its clients wait through the freeze: check --pods predicts it from
	// the pod's memory (its limit: the lab serves no metrics.k8s.io), and
	// so does the move, whose record keeps it beside the downtime.
	var rows []drain.Movability
	if out := l.kubectlMigrate(t, "check", "--pods", "-n", ns, "-o", "json"); json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 1 {
		t.Fatalf("check --pods:\n%s", out)
	}
	predicted := rows[0].Freeze
	if rows[0].Strategy != migrate.CheckpointRestore || predicted == nil || predicted.MemoryFrom != kube.MemoryFromLimits ||
		predicted.MemoryBytes != anyPodMemoryLimit.Value() || predicted.Millis <= 0 || !strings.Contains(rows[0].How, "freeze ≤ ") {
		t.Fatalf("check --pods predicts no freeze from the memory limit: %+v %+v", rows[0], predicted)
	}
	rec := moveRedis(t, l, "pod", ns, "redis", "app=redis")
	if p := rec.Prediction; p == nil || p.Freeze == nil || p.Freeze.MemoryBytes != predicted.MemoryBytes || p.DowntimeMillis != p.Freeze.Millis {
		t.Fatalf("the move's record predicts no freeze: %+v", p)
	}
	t.Logf("freeze predicted %d ms (%s), measured %d ms", rec.Prediction.DowntimeMillis, predicted.Summary(), rec.Downtime.Millis)
}

// TestCheckpointRestoreMovesRedisWithItsEmptyDir: a redis-server that
// logs every write to an append-only file in an emptyDir (fsync on each)
// moves while a client writes without pause, its files with it: the copy
// holds every acknowledged write in memory, as TestCheckpointRestoreMovesRedis
// checks, and again after it reloads its dataset from the file it appended
// to on node-a (DEBUG LOADAOF), so the file moved whole and of the same
// moment as its memory.
func TestCheckpointRestoreMovesRedisWithItsEmptyDir(t *testing.T) {
	concurrent(t)
	l := setup(t)
	l.restoresSomeWay(t)
	ctx := context.Background()
	command := []string{"/usr/bin/redis-server", "--port", "6379", "--protected-mode", "no", "--save", "",
		"--dir", "/data", "--appendonly", "yes", "--appendfsync", "always", "--enable-debug-command", "yes"}
	ns := l.startAnyPodWith(t, "redis", func(pod *corev1.Pod) {
		pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}, command...)
	writes := startRedisWrites(t, l, ns, "app=redis")
	rec, err, jerr := l.migrateWithoutContract(t, "pod", ns, "redis")
	if err != nil || jerr != nil || rec.Outcome != report.Succeeded {
		writes.stop()
		t.Fatalf("migration: %v %v %s", err, jerr, rec.Outcome)
	}
	writes.check(t, "redis", rec.TargetPod)
	reload, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := writes.client.Do(reload, "DEBUG", "LOADAOF").Err(); err != nil {
		t.Fatalf("the copy did not reload its append-only file: %v", err)
	}
	acked := writes.log.all()
	if lost := writes.lost(t, acked); len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes are not in the append-only file the copy reloaded, e.g. %v", len(lost), len(acked), lost[:min(len(lost), 10)])
	}
	t.Logf("the copy reloaded all %d acknowledged writes from its emptyDir's append-only file; downtime %d ms", len(acked), rec.Downtime.Millis)
}

// TestCheckpointRestoreMovesARedisStatefulSet: kubectl migrate sts moves
// ordinal 0 of a StatefulSet of redis-server (no contract, so
// checkpoint/restore) while a client writes to it without pause, as
// TestCheckpointRestoreMovesRedis checks; the pod keeps its name and
// ordinal, its StatefulSet (created again from its spec) owns it on the
// target node, and ordinal 1 was not touched.
func TestCheckpointRestoreMovesARedisStatefulSet(t *testing.T) {
	concurrent(t)
	l := setup(t)
	l.restoresSomeWay(t)
	ctx := context.Background()
	ns := l.startRedisStatefulSet(t)
	other, err := l.client.CoreV1().Pods(ns).Get(ctx, "redis-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	moveRedis(t, l, "sts", ns, "redis-0", appsv1.StatefulSetPodNameLabel+"=redis-0")
	l.redisStatefulSetHolds(t, ns, "node-b", other)
}

// redisStatefulSetHolds checks that StatefulSet redis, its spec unchanged,
// owns redis-0 on node and that redis-1 is still other.
func (l *lab) redisStatefulSetHolds(t *testing.T, ns, node string, other *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	pod, err := l.client.CoreV1().Pods(ns).Get(ctx, "redis-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sts, err := l.client.AppsV1().StatefulSets(ns).Get(ctx, "redis", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the StatefulSet is gone: %v", err)
	}
	if owner := metav1.GetControllerOf(pod); owner == nil || owner.UID != sts.UID || pod.Spec.NodeName != node {
		t.Fatalf("redis-0 on %s owned by %+v, want %s owned by StatefulSet redis (%s)", pod.Spec.NodeName, owner, node, sts.UID)
	}
	if *sts.Spec.Replicas != 2 {
		t.Fatalf("the StatefulSet's spec changed: %d replicas", *sts.Spec.Replicas)
	}
	if now, err := l.client.CoreV1().Pods(ns).Get(ctx, "redis-1", metav1.GetOptions{}); err != nil || now.UID != other.UID || now.Spec.NodeName != "node-a" {
		t.Fatalf("redis-1 was touched: %v", err)
	}
}

// TestRecoverRedisStatefulSetAfterCrash: the plugin moving ordinal 0 of a
// StatefulSet of redis-server (checkpoint/restore: no contract) while a
// client writes to it is killed at a step (with E2E_CRASH_MATRIX=all, at
// each step that journals); kubectl migrate recover undoes the move before
// its commit, restoring the checkpoint on node-a under the pod's name once
// the source is gone, and finishes it after. Either way the StatefulSet
// owns redis-0 where the outcome says, the server is the same process with
// every acknowledged write, the client writes to it again, redis-1 was not
// touched and no agent is left.
func TestRecoverRedisStatefulSetAfterCrash(t *testing.T) {
	// Through the runtime (the containerd 2.4 lane) every move receives on
	// the nodes' ports, which a killed move holds until its recovery: there
	// the cases run one at a time, beside nothing else. Elsewhere each case
	// has a namespace and records of its own.
	oneAtATime := !criRestores()
	if !oneAtATime {
		concurrent(t)
	}
	for _, tc := range everyStep([]crashCase{
		// The source is deleted (detach) before the restore: undoing the
		// move restores its checkpoint on the source node.
		{name: "checkpoint-restore/restore", args: []string{"--inject-crash", "restore"}, want: report.RolledBack},
		{name: "checkpoint-restore/cleanup", args: []string{"--inject-crash", "cleanup"}, want: report.Succeeded},
	}, withoutContractStatefulSet) {
		t.Run(tc.name, func(t *testing.T) {
			if !oneAtATime {
				t.Parallel()
			}
			l := setup(t)
			l.restoresSomeWay(t)
			ctx := context.Background()
			ns := l.startRedisStatefulSet(t)
			other, err := l.client.CoreV1().Pods(ns).Get(ctx, "redis-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			writes := startRedisWrites(t, l, ns, appsv1.StatefulSetPodNameLabel+"=redis-0")
			rec := l.crashAndRecover(t, workload.Attach(l.client, ns, "", ""), tc, "sts", "redis-0", "--registry", l.registry+"/checkpoints")
			node := map[report.Outcome]string{report.RolledBack: "node-a", report.Succeeded: "node-b"}[rec.Outcome]
			if _, err := kube.WaitForPod(ctx, l.client, ns, "redis-0", func(p *corev1.Pod) (bool, error) {
				return p != nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
			}); err != nil {
				writes.stop()
				t.Fatalf("redis-0 does not run after recovery: %v", err)
			}
			writes.checkOn(t, "redis-0", "redis-0", node)
			l.redisStatefulSetHolds(t, ns, node, other)
			l.noAgentsLeft(t, ns)
		})
	}
}

// startRedisStatefulSet creates StatefulSet redis, two ordinals of
// redis-server on node-a, in a namespace of its own, and returns the
// namespace once both run with an IP.
// TestCheckpointRestoreMovesARedisDeployment: a Deployment's redis-server
// pod moves with checkpoint/restore while a client writes to it: every
// acknowledged write is in the same server afterwards, the ReplicaSet
// adopted the copy and never made a pod of its own, and the Deployment
// did not change.
func TestCheckpointRestoreMovesARedisDeployment(t *testing.T) {
	concurrent(t)
	l := setup(t)
	l.restoresSomeWay(t)
	ctx := context.Background()
	ns := fmt.Sprintf("e2e-redis-deploy-%06x", rand.Uint32()>>8)
	l.namespaces(t, ns)
	l.waitDefaultServiceAccount(t, ns)
	selector := map[string]string{"app": "redis"}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "redis", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: selector},
			Template: l.redisTemplate(selector),
		},
	}
	if _, err := l.client.AppsV1().Deployments(ns).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var source *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := l.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=redis"})
		if err != nil || len(list.Items) != 1 || list.Items[0].Status.Phase != corev1.PodRunning || list.Items[0].Status.PodIP == "" {
			return false, nil
		}
		source = &list.Items[0]
		return true, nil
	}); err != nil {
		t.Fatalf("the Deployment's pod never ran: %v", err)
	}
	before, err := l.client.AppsV1().Deployments(ns).Get(ctx, "redis", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	watcher, err := l.client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: source.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Stop()

	target := moveRedis(t, l, "pod", ns, source.Name, "app=redis").TargetPod

	list, err := l.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=redis"})
	if err != nil {
		t.Fatal(err)
	}
	list.Items = slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	if len(list.Items) != 1 || list.Items[0].Name != target || list.Items[0].Spec.NodeName != "node-b" {
		t.Fatalf("the Deployment's pods after the move: %+v; want %s alone, on node-b", list.Items, target)
	}
	rs := metav1.GetControllerOf(&list.Items[0])
	if owner := metav1.GetControllerOf(source); rs == nil || owner == nil || rs.UID != owner.UID {
		t.Fatalf("the copy is controlled by %+v, the source was by %+v", rs, owner)
	}
	// Every pod created in the namespace since the source ran: the copy
	// alone (the watch has them all by now: the copy's create came first).
	for created := false; !created; {
		select {
		case ev := <-watcher.ResultChan():
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				if p.Name != target {
					t.Fatalf("pod %s was created beside the copy: the ReplicaSet made one", p.Name)
				}
				created = true
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the watch never saw the copy created")
		}
	}
	after, err := l.client.AppsV1().Deployments(ns).Get(ctx, "redis", metav1.GetOptions{})
	if err != nil || after.Generation != before.Generation || *after.Spec.Replicas != 1 {
		t.Fatalf("the Deployment changed: %v", err)
	}
}

// redisTemplate is the pod template of a controller's redis-server pods on
// node-a, with labels.
func (l *lab) redisTemplate(labels map[string]string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": "node-a"},
			Containers:   []corev1.Container{{Name: "redis", Image: l.imagePrefix + "/python-consumer:lab", Command: redisServerCommand}},
		},
	}
}

func (l *lab) startRedisStatefulSet(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns := fmt.Sprintf("e2e-redis-sts-%06x", rand.Uint32()>>8)
	l.namespaces(t, ns)
	l.waitDefaultServiceAccount(t, ns)
	labels := map[string]string{"app": "redis"}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "redis", Namespace: ns},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](2), ServiceName: "redis", PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: l.redisTemplate(labels),
		},
	}
	if _, err := l.client.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"redis-0", "redis-1"} {
		if _, err := kube.WaitForPod(ctx, l.client, ns, name, func(p *corev1.Pod) (bool, error) {
			return p != nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
		}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	return ns
}

// moveRedis moves the redis-server pod (with command, pod or sts) while a
// client that dials whichever pod carries selector writes without pause,
// and checks the copy is the same server, holds every acknowledged write,
// and took the client's reconnection; it returns the move's record.
func moveRedis(t *testing.T, l *lab, command, ns, pod, selector string) report.Record {
	t.Helper()
	service := l.serviceFor(t, ns, "redis", selector)
	writes := startRedisWrites(t, l, ns, selector)
	rec, err, jerr := l.migrateWithoutContract(t, command, ns, pod)
	if err != nil || jerr != nil || rec.Outcome != report.Succeeded {
		writes.stop()
		t.Fatalf("migration: %v %v %s", err, jerr, rec.Outcome)
	}
	if rec.Strategy != "checkpoint-restore" || rec.Downtime == nil || rec.Downtime.Millis <= 0 {
		writes.stop()
		t.Fatalf("strategy %s, downtime %+v", rec.Strategy, rec.Downtime)
	}
	writes.check(t, pod, rec.TargetPod)
	l.endpointsFollow(t, ns, service, rec.TargetPod)
	t.Logf("downtime %d ms", rec.Downtime.Millis)
	return rec
}

// serviceFor creates a Service named name in ns for the pods of selector
// (port 6379) and returns its name.
func (l *lab) serviceFor(t testing.TB, ns, name, selector string) string {
	t.Helper()
	set, err := labels.ConvertSelectorToLabelsMap(selector)
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.ServiceSpec{Selector: set, Ports: []corev1.ServicePort{{Port: 6379}}},
	}
	if _, err := l.client.CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// endpointsFollow waits until service's endpoints are pod's address alone,
// ready: the endpoint controller followed the move (the lab has no
// kube-proxy to route by them; the clients dial by label instead).
func (l *lab) endpointsFollow(t testing.TB, ns, service, pod string) {
	t.Helper()
	ctx := context.Background()
	p, err := l.client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := l.client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
		if err != nil {
			return false, nil
		}
		got = nil
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					got = append(got, e.Addresses...)
				}
			}
		}
		return len(got) == 1 && got[0] == p.Status.PodIP, nil
	})
	if err != nil {
		t.Fatalf("Service %s's ready endpoints are %v, want the copy %s's %s alone", service, got, pod, p.Status.PodIP)
	}
}

// redisWrites is a client writing SET key_i i to a redis-server without
// pause, with the log of the writes the server acknowledged.
type redisWrites struct {
	l      *lab
	ns     string
	client *redis.Client
	dials  *labelDialer
	before redisServer
	log    ackLog
	stop   func()
}

// startRedisWrites starts writing to the redis-server that carries
// selector in ns, dialling whichever pod does, and returns once it
// acknowledged 200 writes.
func startRedisWrites(t testing.TB, l *lab, ns, selector string) *redisWrites {
	t.Helper()
	ctx := context.Background()
	r := &redisWrites{l: l, ns: ns, dials: &labelDialer{l: l, ns: ns, selector: selector}}
	r.client = redis.NewClient(&redis.Options{
		Dialer: r.dials.dial, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaxRetries: -1, PoolSize: 1, Protocol: 2, DisableIdentity: true,
	})
	t.Cleanup(func() { r.client.Close() })
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var err error
		if r.before, err = serverInfo(ctx, r.client); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis never answered: %v", err)
		}
	}
	r.stop = r.log.writeWithoutPause(func(i int) bool {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := r.client.Set(c, "key_"+strconv.Itoa(i), i, 0).Err(); err != nil {
			time.Sleep(20 * time.Millisecond) // the server is away: no busy loop while it moves
			return false
		}
		return true
	})
	t.Cleanup(r.stop)
	if !r.log.waitBeyond(200, 30*time.Second) {
		t.Fatal("redis acknowledged no writes")
	}
	return r
}

// check, once source moved to its copy target (on node-b, with its
// labels): the writes go on until some land on the copy, then stop; the
// copy is the same server (its run_id, an uptime that went on), the client
// reconnected to it, and it holds every acknowledged write with its value.
func (r *redisWrites) check(t testing.TB, source, target string) {
	t.Helper()
	r.checkOn(t, source, target, "node-b")
}

// checkOn is check with the node where target must serve: node-a after a
// StatefulSet's move rolled back by restoring its checkpoint there.
func (r *redisWrites) checkOn(t testing.TB, source, target, node string) {
	t.Helper()
	ctx := context.Background()
	copied, err := r.l.client.CoreV1().Pods(r.ns).Get(ctx, target, metav1.GetOptions{})
	if err != nil || copied.Spec.NodeName != node || copied.Labels["app"] != "redis" {
		r.stop()
		t.Fatalf("the copy %s, wanted on %s: %v", target, node, err)
	}
	atMigrated := len(r.log.all())
	if !r.log.waitBeyond(atMigrated+50, 60*time.Second) {
		r.stop()
		t.Fatalf("the client never wrote to the copy (dials: %v)", r.dials.log())
	}
	r.stop()
	acked := r.log.all()
	if target != source {
		if _, err := r.l.client.CoreV1().Pods(r.ns).Get(ctx, source, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the source is still there: %v", err)
		}
	}
	after, err := serverInfo(ctx, r.client)
	if err != nil {
		t.Fatal(err)
	}
	if after.runID != r.before.runID || after.uptime < r.before.uptime {
		t.Fatalf("the copy is another server: run_id %s uptime %d s, was %s and %d s", after.runID, after.uptime, r.before.runID, r.before.uptime)
	}
	if n := r.dials.count(copied.Status.PodIP); n == 0 {
		t.Fatalf("the client never reconnected to the copy at %s (dials: %v)", copied.Status.PodIP, r.dials.log())
	}
	if lost := r.lost(t, acked); len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes lost, e.g. %v", len(lost), len(acked), lost[:min(len(lost), 10)])
	}
	t.Logf("redis: %d acknowledged writes (%d before the move ended), all in the copy %s; same server %s, up %d s; the client dialled %v",
		len(acked), atMigrated, target, after.runID, after.uptime, r.dials.log())
}

// lost is the writes of acked the server does not hold with their value.
func (r *redisWrites) lost(t testing.TB, acked []int) []int {
	t.Helper()
	var lost []int
	for batch := range slices.Chunk(acked, 1000) {
		keys := make([]string, len(batch))
		for j, i := range batch {
			keys[j] = "key_" + strconv.Itoa(i)
		}
		vals, err := r.client.MGet(context.Background(), keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		for j, v := range vals {
			if s, _ := v.(string); s != strconv.Itoa(batch[j]) {
				lost = append(lost, batch[j])
			}
		}
	}
	return lost
}

// redisServer is what tells one redis-server process from another.
type redisServer struct {
	runID  string
	uptime int
}

func serverInfo(ctx context.Context, c *redis.Client) (redisServer, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return redisServer{}, err
	}
	var s redisServer
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch k {
		case "run_id":
			s.runID = v
		case "uptime_in_seconds":
			s.uptime, _ = strconv.Atoi(v)
		}
	}
	if s.runID == "" {
		return s, errors.New("INFO server names no run_id")
	}
	return s, nil
}

// labelDialer connects to whichever running pod carries the selector's
// labels, from the lab's network, as a Service's endpoints would route: a
// migration moves the labels from the source to the copy, and the client
// follows them. It logs each pod IP it dialled.
type labelDialer struct {
	l        *lab
	ns       string
	selector string
	mu       sync.Mutex
	dialled  []string
}

func (d *labelDialer) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	pods, err := d.l.client.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{LabelSelector: d.selector})
	if err != nil {
		return nil, err
	}
	var ip string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Status.PodIP != "" {
			ip = p.Status.PodIP
		}
	}
	if ip == "" {
		return nil, fmt.Errorf("no running pod has %s", d.selector)
	}
	var conn net.Conn
	err = inNetns("klab", func() (err error) {
		conn, err = (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", net.JoinHostPort(ip, "6379"))
		return err
	})
	if err == nil {
		d.mu.Lock()
		d.dialled = append(d.dialled, ip)
		d.mu.Unlock()
	}
	return conn, err
}

func (d *labelDialer) count(ip string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, x := range d.dialled {
		if x == ip {
			n++
		}
	}
	return n
}

func (d *labelDialer) log() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dialled...)
}

// BenchmarkAnyPodFreeze measures how long a pod without the MS2M contract
// is frozen when it moves with checkpoint/restore: the downtime, from the
// cut to the copy taking its place, of Debian's redis-server idle and
// holding E2E_REDIS_STATE of values (default 256Mi), through the container
// runtime's restore (direct transfer) and the kubectl-migrate runtime's,
// alternating within each of E2E_EVAL_RUNS rounds (default 5). It reports
// the medians of the downtime and of its two biggest steps (the kubelet's
// checkpoint call, the restore), the runtime's ratio to the CRI path at
// each size, and each path's ratio of full to idle. Each server is deleted
// after its run, so only one holds its state at a time.
//
//	go test -tags e2e -run '^$' -bench AnyPodFreeze -benchtime 1x ./test/e2e
func BenchmarkAnyPodFreeze(b *testing.B) {
	rounds := evalRounds(5)
	state := resource.MustParse(cmp.Or(os.Getenv("E2E_REDIS_STATE"), "256Mi"))
	full := state.String()
	l := setup(b)
	l.setUpRuntime(b)
	figures := map[string][]float64{}
	for range rounds {
		for _, size := range []string{"idle", full} {
			for _, path := range []string{"cri", "runtime"} {
				ns := l.startAnyPod(b, "redis", redisServerCommand...)
				var fill int64
				if size != "idle" {
					fill = state.Value()
				}
				used := fillRedis(b, l, ns, fill)
				rec, err, jerr := l.migrateWithoutContract(b, "pod", ns, "redis", restorePaths[path]...)
				if err != nil || jerr != nil || rec.Outcome != report.Succeeded || rec.Downtime == nil {
					b.Fatalf("%s, %s: %v %v %s", path, size, err, jerr, rec.Outcome)
				}
				key := size + "-" + path
				figures[key+"-freeze"] = append(figures[key+"-freeze"], float64(rec.Downtime.Millis))
				stepFigures(figures, key, rec, map[report.StepName]string{report.CheckpointCall: "checkpoint-call", report.StagedRunning: "restore", report.PodRunning: "restore"})
				b.Logf("%s, %s (redis used %d MiB): freeze %d ms; %s", path, size, used>>20, rec.Downtime.Millis, stepSummary(rec))
				if err := l.client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	for _, size := range []string{"idle", full} {
		for _, path := range []string{"cri", "runtime"} {
			for _, metric := range []string{"freeze", "checkpoint-call", "restore"} {
				b.ReportMetric(median(figures[size+"-"+path+"-"+metric]), size+"-"+path+"-"+metric+"-ms")
			}
		}
		b.ReportMetric(median(figures[size+"-runtime-freeze"])/median(figures[size+"-cri-freeze"]), size+"-runtime/cri-freeze-ratio")
	}
	for _, path := range []string{"cri", "runtime"} {
		b.ReportMetric(median(figures[full+"-"+path+"-freeze"])/median(figures["idle-"+path+"-freeze"]), path+"-"+full+"/idle-freeze-ratio")
	}
}

// fillRedis writes n bytes of values (1 MiB each, not compressible) into
// the redis-server in ns and returns the memory it then says it uses.
func fillRedis(b testing.TB, l *lab, ns string, n int64) int64 {
	b.Helper()
	ctx := context.Background()
	dials := &labelDialer{l: l, ns: ns, selector: "app=redis"}
	client := redis.NewClient(&redis.Options{Dialer: dials.dial, DialTimeout: time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, Protocol: 2, DisableIdentity: true})
	defer client.Close()
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return client.Ping(ctx).Err() == nil, nil
	}); err != nil {
		b.Fatalf("redis never answered: %v", err)
	}
	value := make([]byte, 1<<20)
	rng := rand.NewChaCha8([32]byte{})
	for i := int64(0); i < n>>20; i++ {
		_, _ = rng.Read(value)
		if err := client.Set(ctx, "ballast_"+strconv.FormatInt(i, 10), value, 0).Err(); err != nil {
			b.Fatal(err)
		}
	}
	info, err := client.Info(ctx, "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			used, _ := strconv.ParseInt(v, 10, 64)
			return used
		}
	}
	b.Fatalf("INFO memory names no used_memory:\n%s", info)
	return 0
}
