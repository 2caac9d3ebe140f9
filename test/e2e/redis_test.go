//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
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
	moveRedis(t, l, "pod", ns, "redis", "app=redis")
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
	pod, err := l.client.CoreV1().Pods(ns).Get(ctx, "redis-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sts, err := l.client.AppsV1().StatefulSets(ns).Get(ctx, "redis", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the StatefulSet is gone: %v", err)
	}
	if owner := metav1.GetControllerOf(pod); owner == nil || owner.UID != sts.UID || pod.Spec.NodeName != "node-b" {
		t.Fatalf("redis-0 on %s owned by %+v, want node-b owned by StatefulSet redis (%s)", pod.Spec.NodeName, owner, sts.UID)
	}
	if *sts.Spec.Replicas != 2 {
		t.Fatalf("the StatefulSet's spec changed: %d replicas", *sts.Spec.Replicas)
	}
	if now, err := l.client.CoreV1().Pods(ns).Get(ctx, "redis-1", metav1.GetOptions{}); err != nil || now.UID != other.UID || now.Spec.NodeName != "node-a" {
		t.Fatalf("redis-1 was touched: %v", err)
	}
}

// startRedisStatefulSet creates StatefulSet redis, two ordinals of
// redis-server on node-a, in a namespace of its own, and returns the
// namespace once both run with an IP.
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
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": "node-a"},
					Containers:   []corev1.Container{{Name: "redis", Image: l.imagePrefix + "/python-consumer:lab", Command: redisServerCommand}},
				},
			},
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
// and took the client's reconnection.
func moveRedis(t *testing.T, l *lab, command, ns, pod, selector string) {
	t.Helper()
	ctx := context.Background()
	dials := &labelDialer{l: l, ns: ns, selector: selector}
	client := redis.NewClient(&redis.Options{
		Dialer: dials.dial, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		MaxRetries: -1, PoolSize: 1, Protocol: 2, DisableIdentity: true,
	})
	defer client.Close()
	var before redisServer
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var err error
		if before, err = serverInfo(ctx, client); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis never answered: %v", err)
		}
	}

	var log ackLog
	stopWriting := log.writeWithoutPause(func(i int) bool {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := client.Set(c, "key_"+strconv.Itoa(i), i, 0).Err(); err != nil {
			time.Sleep(20 * time.Millisecond) // the server is away: no busy loop while it moves
			return false
		}
		return true
	})
	if !log.waitBeyond(200, 30*time.Second) {
		stopWriting()
		t.Fatal("redis acknowledged no writes")
	}

	rec, err, jerr := l.migrateWithoutContract(t, command, ns, pod, "")
	if err != nil || jerr != nil || rec.Outcome != report.Succeeded {
		stopWriting()
		t.Fatalf("migration: %v %v %s", err, jerr, rec.Outcome)
	}
	target, err := l.client.CoreV1().Pods(ns).Get(ctx, rec.TargetPod, metav1.GetOptions{})
	if err != nil || target.Spec.NodeName != "node-b" || target.Labels["app"] != "redis" {
		stopWriting()
		t.Fatalf("the copy %s: %v", rec.TargetPod, err)
	}
	// Writes go on until some land on the copy, so the log holds writes
	// from before, during and after the move.
	atMigrated := len(log.all())
	if !log.waitBeyond(atMigrated+50, 60*time.Second) {
		stopWriting()
		t.Fatalf("the client never wrote to the copy (dials: %v)", dials.log())
	}
	stopWriting()
	acked := log.all()

	if rec.Strategy != "checkpoint-restore" || rec.Downtime == nil || rec.Downtime.Millis <= 0 {
		t.Fatalf("strategy %s, downtime %+v", rec.Strategy, rec.Downtime)
	}
	if rec.TargetPod != pod {
		if _, err := l.client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("the source is still there: %v", err)
		}
	}
	after, err := serverInfo(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	if after.runID != before.runID || after.uptime < before.uptime {
		t.Fatalf("the copy is another server: run_id %s uptime %d s, was %s and %d s", after.runID, after.uptime, before.runID, before.uptime)
	}
	if n := dials.count(target.Status.PodIP); n == 0 {
		t.Fatalf("the client never reconnected to the copy at %s (dials: %v)", target.Status.PodIP, dials.log())
	}
	var lost []int
	for batch := range slices.Chunk(acked, 1000) {
		keys := make([]string, len(batch))
		for j, i := range batch {
			keys[j] = "key_" + strconv.Itoa(i)
		}
		vals, err := client.MGet(ctx, keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		for j, v := range vals {
			if s, _ := v.(string); s != strconv.Itoa(batch[j]) {
				lost = append(lost, batch[j])
			}
		}
	}
	if len(lost) > 0 {
		t.Fatalf("%d of %d acknowledged writes lost, e.g. %v", len(lost), len(acked), lost[:min(len(lost), 10)])
	}
	t.Logf("%d acknowledged writes (%d before the record), all in the copy; same server %s, up %d s; the client dialled %v; downtime %d ms",
		len(acked), atMigrated, after.runID, after.uptime, dials.log(), rec.Downtime.Millis)
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
