//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
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
	ns := l.startAnyPod(t, "redis", "/usr/bin/redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no")

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

	rec, err, jerr := l.migrateAnyPod(t, ns, "redis", "")
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
