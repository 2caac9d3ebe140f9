//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
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
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/kube"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

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
	ctx := context.Background()
	ns := fmt.Sprintf("e2e-redis-%06x", rand.Uint32()>>8)
	l.namespaces(t, ns)
	l.waitDefaultServiceAccount(t, ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "redis", Namespace: ns, Labels: map[string]string{"app": "redis"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{
			Name: "redis", Image: l.imagePrefix + "/python-consumer:lab",
			Command: []string{"/usr/bin/redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no"},
		}}},
	}
	if _, err := l.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.WaitForPod(ctx, l.client, ns, "redis", func(p *corev1.Pod) (bool, error) {
		return p != nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "", nil
	}); err != nil {
		t.Fatal(err)
	}

	dials := &labelDialer{l: l, ns: ns, selector: "app=redis"}
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

	var acked []int
	var mu sync.Mutex
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := client.Set(c, "key_"+strconv.Itoa(i), i, 0).Err()
			cancel()
			if err != nil {
				time.Sleep(20 * time.Millisecond) // the server is away: no busy loop while it moves
				continue
			}
			mu.Lock()
			acked = append(acked, i)
			mu.Unlock()
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 200 {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			t.Fatal("redis acknowledged no writes")
		}
	}

	argv := []string{"migrate", "-n", ns, "pod", "redis", "--to", "node-b", "--agent-image", l.imagePrefix + "/kubectl-migrate-agent:lab",
		"--insecure-registry", "--allow-anonymous-checkpoints", "--registry", l.registry + "/checkpoints", "-o", "json"}
	cmd := l.kubectlCommand(argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("kubectl %s:\n%s", strings.Join(argv, " "), stderr.String())
	var rec report.Record
	if jerr := json.Unmarshal(stdout.Bytes(), &rec); err != nil || jerr != nil || rec.Outcome != report.Succeeded {
		close(stop)
		t.Fatalf("migration: %v %v %s\n%s", err, jerr, rec.Outcome, stdout.String())
	}
	// Writes go on until one lands on the copy, so the log holds writes
	// from before, during and after the move.
	target, err := l.client.CoreV1().Pods(ns).Get(ctx, rec.TargetPod, metav1.GetOptions{})
	if err != nil || target.Spec.NodeName != "node-b" || target.Labels["app"] != "redis" {
		close(stop)
		t.Fatalf("the copy %s: %v", rec.TargetPod, err)
	}
	mu.Lock()
	atMigrated := len(acked)
	mu.Unlock()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n > atMigrated+50 {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			t.Fatalf("the client never wrote to the copy (dials: %v)", dials.log())
		}
	}
	close(stop)
	<-done

	if rec.Strategy != "checkpoint-restore" || rec.Downtime == nil || rec.Downtime.Millis <= 0 {
		t.Fatalf("strategy %s, downtime %+v", rec.Strategy, rec.Downtime)
	}
	if _, err := l.client.CoreV1().Pods(ns).Get(ctx, "redis", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the source is still there: %v", err)
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
