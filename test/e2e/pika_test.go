//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kubectl-migrate/kubectl-migrate/pkg/broker"
	"github.com/kubectl-migrate/kubectl-migrate/pkg/report"
)

// pikaPrefetch is how many messages the plain consumer holds unacknowledged
// at most: the bound on what a move can make it apply twice.
const pikaPrefetch = 20

// plainPikaConsumer is a RabbitMQ consumer as people write one without
// knowing MS2M: Debian's pika, a blocking connection, apply then ack, and
// reconnect when the connection drops. It counts how often it applied each
// message body and serves that, with the process's start nonce, on
// :8080/dump. argv: broker URL, queue.
var plainPikaConsumer = `
import http.server, json, sys, threading, time, uuid, pika
url, queue = sys.argv[1], sys.argv[2]
applied, connections, lock, nonce = {}, [0], threading.Lock(), uuid.uuid4().hex
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with lock: body = json.dumps({"nonce": nonce, "connections": connections[0], "applied": applied}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
threading.Thread(target=http.server.ThreadingHTTPServer(("", 8080), H).serve_forever, daemon=True).start()
def apply(ch, method, props, body):
    with lock: applied[body.decode()] = applied.get(body.decode(), 0) + 1
    ch.basic_ack(method.delivery_tag)
while True:
    try:
        params = pika.URLParameters(url); params.heartbeat = 5
        conn = pika.BlockingConnection(params)
        with lock: connections[0] += 1
        ch = conn.channel(); ch.basic_qos(prefetch_count=` + strconv.Itoa(pikaPrefetch) + `)
        ch.basic_consume(queue, apply)
        ch.start_consuming()
    except Exception as e:
        print("connection lost, reconnecting:", repr(e), flush=True); time.sleep(0.5)
`

// pikaDump is what plainPikaConsumer's /dump answers.
type pikaDump struct {
	Nonce       string         `json:"nonce"`
	Connections int            `json:"connections"`
	Applied     map[string]int `json:"applied"`
}

// TestCheckpointRestoreMovesAConsumerWithoutTheContract: a plain pika
// consumer (no annotations, no SDK) moves with checkpoint/restore while a
// publisher sends without pause. Its connection is reset on restore, so the
// broker redelivers what it held unacknowledged: afterwards the copy is the
// same process (its nonce), it reconnected, and it applied every message
// the broker confirmed at least once; the messages it applied twice are
// counted and, since it acks after it applies, no more than its prefetch.
func TestCheckpointRestoreMovesAConsumerWithoutTheContract(t *testing.T) {
	concurrent(t)
	l := setup(t)
	l.restoresSomeWay(t)
	ctx := context.Background()

	queue := fmt.Sprintf("plain-%06x", rand.Uint32()>>8)
	admin, err := broker.Dial(ctx, l.brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.DeleteQueue(context.Background(), queue)
		admin.Close()
	})
	if err := admin.DeclareQueue(ctx, queue); err != nil {
		t.Fatal(err)
	}
	// The publisher: a connection of its own, in confirm mode.
	conn, err := amqp.Dial(l.brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		t.Fatal(err)
	}

	ns := l.startAnyPod(t, "pika", "/usr/bin/python3", "-u", "-c", plainPikaConsumer, l.brokerURL, queue)
	dump := func(pod string) (pikaDump, error) {
		var d pikaDump
		body, err := l.podGet(ctx, ns, pod, "/dump", nil)
		if err == nil {
			err = json.Unmarshal(body, &d)
		}
		return d, err
	}
	var before pikaDump
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		before, err = dump("pika")
		return err == nil && before.Connections > 0, nil
	}); err != nil {
		t.Fatalf("the consumer never connected: %v %+v", err, before)
	}

	// The publisher sends body i and logs i once the broker confirms it.
	var log ackLog
	stopPublishing := log.writeWithoutPause(func(i int) bool {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		time.Sleep(2 * time.Millisecond) // a steady rate the consumer keeps up with
		dc, err := ch.PublishWithDeferredConfirmWithContext(c, "", queue, false, false, amqp.Publishing{Body: []byte(strconv.Itoa(i))})
		if err != nil {
			return false
		}
		ok, err := dc.WaitContext(c)
		return err == nil && ok
	})
	if !log.waitBeyond(200, 30*time.Second) {
		stopPublishing()
		t.Fatal("the broker confirmed no messages")
	}

	rec, err, jerr := l.migrateAnyPod(t, ns, "pika", "")
	stopPublishing()
	confirmed := log.all()
	if err != nil || jerr != nil || rec.Outcome != report.Succeeded {
		t.Fatalf("migration: %v %v %s", err, jerr, rec.Outcome)
	}
	if rec.Strategy != "checkpoint-restore" || rec.Downtime == nil || rec.Downtime.Millis <= 0 {
		t.Fatalf("strategy %s, downtime %+v", rec.Strategy, rec.Downtime)
	}
	if _, err := l.client.CoreV1().Pods(ns).Get(ctx, "pika", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the source is still there: %v", err)
	}

	// The broker redelivers what the source held unacknowledged once it
	// sees that connection gone (heartbeat 5 s): wait for every confirmed
	// message to be applied.
	missing := func(d pikaDump) []int {
		var m []int
		for _, i := range confirmed {
			if d.Applied[strconv.Itoa(i)] == 0 {
				m = append(m, i)
			}
		}
		return m
	}
	var after pikaDump
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		d, err := dump(rec.TargetPod)
		if err != nil {
			return false, nil
		}
		after = d
		return len(missing(d)) == 0, nil
	}); err != nil {
		m := missing(after)
		t.Fatalf("%d of %d confirmed messages never applied, e.g. %v", len(m), len(confirmed), m[:min(len(m), 10)])
	}
	if after.Nonce != before.Nonce {
		t.Fatalf("the copy is another process (nonce %s, was %s): started afresh, not restored", after.Nonce, before.Nonce)
	}
	if after.Connections < 2 {
		t.Fatalf("the copy never reconnected (%d connections)", after.Connections)
	}
	twice := 0
	for _, n := range after.Applied {
		twice += n - 1
	}
	if twice > pikaPrefetch {
		t.Fatalf("%d messages applied twice: more than the %d the consumer can hold unacknowledged", twice, pikaPrefetch)
	}
	t.Logf("%d confirmed messages, all applied by the same process after it reconnected (%d connections); %d applied twice; downtime %d ms",
		len(confirmed), after.Connections, twice, rec.Downtime.Millis)
}
