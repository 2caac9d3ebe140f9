#!/usr/bin/env python3
"""A migratable MS2M consumer in Python (pika), implementing docs/contract.md
version 4 without any Go: the reference for teams whose consumers are not Go.

The application part is `apply` (the evaluation's sample: add each message's
"value" to a sum, taking --work); everything else is the contract, which a
team would lift into a module of its own. Configuration: --url, --exchange,
--queue, --listen, --work, or MS2M_BROKER_URL, MS2M_EXCHANGE, MS2M_QUEUE; the
control token from MS2M_TOKEN_FILE (default /var/run/secrets/ms2m/token, where
the pod mounts the namespace's Secret ms2m-control).
"""
import argparse
import hmac
import json
import os
import random
import signal
import struct
import sys
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pika
import pika.exceptions

CONTRACT = 4
HOLD, PRIMARY, REPLAY = "hold", "primary", "replay"
H_PRODUCER, H_SEQ, H_SENT, H_MARKER, H_PARKED = "ms2m-producer", "ms2m-seq", "ms2m-sent", "ms2m-marker", "ms2m-parked"
MAX_ATTEMPTS, RETRY_DELAY, HOLD_CHECK = 3, 0.1, 1.0
MAX_RETIRED, HISTORY = 32, 20000
TOKEN_FILE = os.environ.get("MS2M_TOKEN_FILE", "/var/run/secrets/ms2m/token")
TOKEN_HEADER = "Ms2m-Token"
NAMESPACE_FILES = ("/var/run/secrets/kubernetes.io/serviceaccount/namespace", "/etc/podinfo/namespace")


def log(msg):
    print(time.strftime("%Y/%m/%d %H:%M:%S"), msg, file=sys.stderr, flush=True)


def now_rfc3339():
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def message_hash(producer, seq):
    return fnv1a64(producer.encode() + struct.pack(">Q", seq))


def pod_identity():
    """NAMESPACE/POD of the pod this process runs in now, read afresh from
    what the pod mounts: never from memory, which a restore brings back."""
    try:
        with open("/etc/hostname") as f:
            name = f.read().strip().split(".")[0]
    except OSError:
        return ""
    if not name:
        return ""
    for path in NAMESPACE_FILES:
        try:
            with open(path) as f:
                return f.read().strip() + "/" + name
        except OSError:
            continue
    return "/" + name


def read_token():
    """The control token the pod mounts now, or None."""
    try:
        with open(TOKEN_FILE, "rb") as f:
            return f.read().strip() or None
    except OSError:
        return None


def token_matches(token, got):
    return bool(token) and got is not None and hmac.compare_digest(token, got.strip())


def may_run_in(homes, where):
    if not homes or not where:
        return True
    ns, _, name = where.partition("/")
    for home in homes:
        hns, _, hname = home.partition("/")
        if hname == name and (hns == ns or not hns or not ns):
            return True
    return False


def header_uint(headers, name):
    v = headers.get(name)
    if isinstance(v, bool) or v is None:
        raise ValueError("no %s header" % name)
    if isinstance(v, bytes):
        v = v.decode()
    if isinstance(v, str):
        if not v.isdigit():
            raise ValueError("header %s %r is not a decimal number" % (name, v))
        v = int(v)
    if not isinstance(v, int) or v < 0:
        raise ValueError("header %s is not a non-negative integer" % name)
    return v


class Consumer:
    def __init__(self, url, exchange, queue, work, broken=""):
        self.url, self.exchange, self.queue, self.work = url, exchange, queue, work
        self.broken = broken  # a contract violation on purpose, to test the check
        self.mu = threading.Lock()
        self.wake = threading.Event()
        self.waiters = []
        self.history = []
        self.held = False
        self.failed = (None, 0)
        self.digest = 0
        self.sum = 0  # the application's state
        self.was_connected = False
        # Kept in memory: a restored copy compares it with what its new pod
        # mounts, which only pods of its namespace can match.
        self.token = read_token()
        home = pod_identity()
        self.st = {
            "contract": CONTRACT, "mode": PRIMARY, "queue": queue,
            "totals": {"count": 0, "digest": "%016x" % 0},
            "producer": "", "lastSeq": 0, "retiredProducers": [], "skipped": 0,
            "reconnects": 0, "parked": 0,
            "process": "%x-%x" % (time.time_ns(), random.getrandbits(32)),
            "startedAt": now_rfc3339(), "homes": [home] if home else [],
        }

    # --- state -------------------------------------------------------------

    def state(self):
        with self.mu:
            st = json.loads(json.dumps(self.st))
            st["app"] = {"sum": self.sum}
        return st

    def reached(self, producer, seq):
        st = self.st
        if producer == st["producer"]:
            return st["lastSeq"] >= seq
        if seq == 0 and producer == "":
            return True
        return producer in st["retiredProducers"]

    def pass_locked(self, producer, seq):
        self.failed = (None, 0)
        st = self.st
        if producer != st["producer"]:
            if st["lastSeq"] or st["producer"]:
                st["retiredProducers"] = (st["retiredProducers"] + [st["producer"]])[-MAX_RETIRED:]
            st["producer"], st["lastSeq"] = producer, 0
        st["lastSeq"] = seq

    def to_primary_locked(self):
        self.st.update(mode=PRIMARY, queue=self.queue, switchedAt=now_rfc3339())
        self.st.pop("untilProducer", None)
        self.st.pop("untilSeq", None)
        self.wake.set()

    def desired(self):
        with self.mu:
            return self.st["mode"], self.st.get("queue", "")

    def settle(self):
        with self.mu:
            waiters, self.waiters = self.waiters, []
        for w in waiters:
            w.set()

    # --- control -----------------------------------------------------------

    def control(self, msg):
        """Applies a control message; returns an Event set once the consume
        loop acted on it, or None when it is in effect already."""
        kind, payload = msg.get("type"), msg.get("payload") or {}
        with self.mu:
            st = self.st
            if st.get("foreign") and kind != "STOP":
                raise ValueError("this copy runs in pod %s, which no migration named (its pods: %s); it consumes nothing" % (st["foreign"], st["homes"]))
            if kind == "PREPARE":
                st["pendingRestore"] = True
                self.add_home_locked(payload.get("target"))
                return None
            elif kind == "CHECKPOINTED":
                st["pendingRestore"] = False
                if self.held:
                    self.held = False
                    st.update(mode=PRIMARY, queue=self.queue)
            elif kind == "START_REPLAY":
                if not payload.get("queue"):
                    raise ValueError("START_REPLAY needs payload.queue")
                st["pendingRestore"], self.held = False, False
                st.update(mode=REPLAY, queue=payload["queue"])
                st.pop("untilProducer", None)
                st.pop("untilSeq", None)
            elif kind == "END_REPLAY":
                st["pendingRestore"], self.held = False, False
                producer, seq = payload.get("untilProducer", ""), payload.get("untilSeq", 0)
                if st["mode"] != REPLAY or self.reached(producer, seq):
                    self.to_primary_locked()
                else:
                    st["untilProducer"], st["untilSeq"] = producer, seq
                    return None
            elif kind == "STOP" and self.broken == "ignore-stop":
                log("deliberately broken: answering STOP as if stopped, consuming on")
                return None
            elif kind == "STOP":
                st.update(mode=HOLD, queue="")
                self.add_home_locked(payload.get("target"))
            elif kind == "RESUME":
                st["pendingRestore"], self.held = False, False
                self.to_primary_locked()
            else:
                raise ValueError("unknown control message type %r" % kind)
            done = threading.Event()
            self.waiters.append(done)
            self.wake.set()
            return done

    def add_home_locked(self, target):
        if target and target not in self.st["homes"]:
            self.st["homes"].append(target)

    # --- broker ------------------------------------------------------------

    def run(self):
        backoff = 0.0
        while True:
            self.was_connected = False
            try:
                self.session()
            except (pika.exceptions.AMQPError, OSError) as e:
                err = e
            if self.was_connected:
                backoff = 0.0  # a restore kills an established connection: redial at once
            log("broker session ended: %r; reconnecting in %.1fs" % (err, backoff))
            self.settle()  # nothing consumes while disconnected
            time.sleep(backoff)
            backoff = min(max(2 * backoff, 0.1), 2.0)
            self.reconnected()

    def reconnected(self):
        with self.mu:
            st = self.st
            st["reconnects"] += 1
            where = pod_identity()
            why = ""
            if not may_run_in(st["homes"], where):
                why = "which neither this state's pods %s nor a migration named" % st["homes"]
            elif not token_matches(self.token, read_token()):
                why = "which does not mount this state's control token (a pod of another namespace)"
            if why and not st.get("foreign"):
                st["foreign"] = where or "(unknown)"
                self.held = True
                st.update(mode=HOLD, queue="")
                log("restored into pod %s, %s: holding, consuming nothing" % (st["foreign"], why))
                return
            if (st.get("pendingRestore") or st["mode"] == HOLD) and not self.held:
                self.held = True
                st["mode"] = HOLD
                log("restored from a checkpoint: holding until told to replay")

    def session(self):
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        self.was_connected = True
        try:
            ch = conn.channel()
            ch.exchange_declare(self.exchange, "fanout", durable=True)
            ch.queue_declare(self.queue, durable=True)
            ch.queue_bind(self.queue, self.exchange)
            ch.queue_declare(self.queue + ".ms2m-parked", durable=True)
            ch.close()
            while True:
                mode, queue = self.desired()
                if mode == HOLD:
                    self.settle()
                    self.wake.clear()
                    deadline = time.monotonic() + HOLD_CHECK
                    while not self.wake.is_set() and time.monotonic() < deadline:
                        conn.process_data_events(time_limit=0.05)  # notices a dead connection
                    if not self.wake.is_set() and self.is_held() and self.migration_gone(conn):
                        self.resume_after_restart()
                    continue
                self.consume(conn, queue)
        finally:
            try:
                conn.close()
            except Exception:
                pass

    def is_held(self):
        with self.mu:
            return self.held

    def migration_gone(self, conn):
        ch = conn.channel()
        try:
            ch.queue_declare(self.queue + ".ms2m-migration", passive=True)
            ch.close()
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code == 404

    def resume_after_restart(self):
        with self.mu:
            if not self.held or self.st["mode"] != HOLD or self.st.get("foreign"):
                return
            self.held, self.st["pendingRestore"] = False, False
            self.st["restoredAgain"] = self.st.get("restoredAgain", 0) + 1
            log("restored from the checkpoint again with no migration running (a restart): resuming %s" % self.queue)
            self.to_primary_locked()

    def consume(self, conn, queue):
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1)
        ch.confirm_delivery()  # for parking
        self.wake.clear()
        self.settle()
        log("consuming %s" % queue)
        try:
            for method, props, body in ch.consume(queue, inactivity_timeout=0.05):
                if self.wake.is_set():
                    self.wake.clear()
                    mode, q = self.desired()
                    if mode == HOLD or q != queue:
                        break
                    self.settle()
                if method is not None:
                    self.handle(ch, method, props, body, queue)
        finally:
            try:
                ch.close()  # an unacknowledged message goes back to its queue
            except pika.exceptions.AMQPError:
                pass  # the connection is gone, and with it the channel

    def handle(self, ch, method, props, body, queue):
        start = time.monotonic()
        headers = props.headers or {}
        marker = headers.get(H_MARKER)
        if marker:
            with self.mu:
                self.st["barrier"] = marker.decode() if isinstance(marker, bytes) else marker
            ch.basic_ack(method.delivery_tag)
            return
        try:
            seq = header_uint(headers, H_SEQ)
            if seq == 0:
                raise ValueError("header %s is 0; sequences start at 1" % H_SEQ)
            producer = headers.get(H_PRODUCER) or ""
            producer = producer.decode() if isinstance(producer, bytes) else str(producer)
        except ValueError as e:
            self.park(ch, method, props, body, "no message identity (%s): stamp messages with headers %s and %s" % (e, H_PRODUCER, H_SEQ))
            return
        with self.mu:
            duplicate = self.reached(producer, seq)
            if duplicate:
                self.st["skipped"] += 1
            attempt = 1 + (self.failed[1] if self.failed[0] == (producer, seq) else 0)
        if duplicate:
            ch.basic_ack(method.delivery_tag)
            return
        try:
            self.apply(body)
            err = None
        except Exception as e:  # "not applied"
            err = e
        if err is None:
            self.applied(producer, seq, headers, queue)
            ch.basic_ack(method.delivery_tag)
            self.served(time.monotonic() - start)
        elif attempt >= MAX_ATTEMPTS:
            self.park(ch, method, props, body, "handler failed %d times, last: %s" % (attempt, err))
            with self.mu:
                self.pass_locked(producer, seq)
        else:
            with self.mu:
                self.failed = ((producer, seq), attempt)
            log("message %d of %s not applied (attempt %d of %d): %s" % (seq, producer, attempt, MAX_ATTEMPTS, err))
            time.sleep(attempt * RETRY_DELAY)
            ch.basic_nack(method.delivery_tag, requeue=True)

    def apply(self, body):
        """The application: what a team writes."""
        value = json.loads(body)["value"]
        if self.work:
            time.sleep(self.work)
        with self.mu:
            self.sum += int(value)

    def applied(self, producer, seq, headers, queue):
        with self.mu:
            st = self.st
            self.pass_locked(producer, seq)
            st["totals"]["count"] += 1
            self.digest = (self.digest + message_hash(producer, seq)) & 0xFFFFFFFFFFFFFFFF
            st["totals"]["digest"] = "%016x" % self.digest
            now = now_rfc3339()
            st["lastAppliedAt"] = now
            sent = headers.get(H_SENT)
            sent = datetime.fromtimestamp(sent / 1e9, timezone.utc).isoformat().replace("+00:00", "Z") if isinstance(sent, int) else "0001-01-01T00:00:00Z"
            if len(self.history) >= 2 * HISTORY:
                self.history = self.history[HISTORY:]
            self.history.append({"producer": producer, "seq": seq, "sent": sent, "appliedAt": now, "queue": queue})
            if st["mode"] == REPLAY and st.get("untilSeq") and self.reached(st.get("untilProducer", ""), st["untilSeq"]):
                self.to_primary_locked()

    def served(self, took):
        ms = took * 1000
        with self.mu:
            prev = self.st.get("serviceMillis", 0)
            self.st["serviceMillis"] = ms if not prev else prev + (ms - prev) / 10

    def park(self, ch, method, props, body, reason):
        log("parking a message on %s.ms2m-parked: %s" % (self.queue, reason))
        headers = dict(props.headers or {})
        headers[H_PARKED] = reason
        try:
            ch.basic_publish("", self.queue + ".ms2m-parked", body, pika.BasicProperties(
                headers=headers, content_type=props.content_type, delivery_mode=2, message_id=props.message_id), mandatory=True)
        except pika.exceptions.AMQPError as e:
            log("could not park it (%r): returning it to its queue" % e)
            ch.basic_nack(method.delivery_tag, requeue=True)
            return
        ch.basic_ack(method.delivery_tag)
        with self.mu:
            self.st["parked"] += 1

    def applied_after(self, producer, seq):
        with self.mu:
            for i in range(len(self.history) - 1, -1, -1):
                a = self.history[i]
                if a["producer"] == producer and a["seq"] <= seq:
                    return self.history[i + 1] if i + 1 < len(self.history) else None
            for a in self.history:
                if a["producer"] == producer and a["seq"] > seq:
                    return a
        return None


def serve(consumer, listen):
    class Handler(BaseHTTPRequestHandler):
        def reply(self, status, obj=None, text=None):
            data = (json.dumps(obj) + "\n").encode() if obj is not None else (text or "").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if obj is not None else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def refused(self):
            """Every /ms2m/ call must carry the control token."""
            if not urlparse(self.path).path.startswith("/ms2m/"):
                return False
            got = self.headers.get(TOKEN_HEADER)
            if token_matches(consumer.token, got.encode() if got else None):
                return False
            self.reply(401, text="missing or wrong %s header: send the token of the namespace's Secret ms2m-control" % TOKEN_HEADER)
            return True

        def do_GET(self):
            if self.refused():
                return
            url = urlparse(self.path)
            if url.path == "/ms2m/state":
                self.reply(200, consumer.state())
            elif url.path == "/ms2m/applied":
                q = parse_qs(url.query)
                try:
                    after = int(q.get("after", [""])[0])
                except ValueError:
                    return self.reply(400, text="after must be a sequence number")
                a = consumer.applied_after(q.get("producer", [""])[0], after)
                self.reply(200, a) if a else self.reply(404, text="nothing applied after that sequence yet")
            elif url.path == "/healthz":
                self.reply(200, text="ok")
            elif url.path == "/readyz":
                mode = consumer.state()["mode"]
                self.reply(503, text="holding") if mode == HOLD else self.reply(200, text="ok")
            else:
                self.reply(404, text="not found")

        def do_POST(self):
            if self.refused():
                return
            if urlparse(self.path).path != "/ms2m/control":
                return self.reply(404, text="not found")
            length = int(self.headers.get("Content-Length") or 0)
            if length > 1 << 20:
                return self.reply(413, text="control message too large")
            try:
                msg = json.loads(self.rfile.read(length) or b"{}")
                done = consumer.control(msg)
            except (ValueError, json.JSONDecodeError) as e:
                return self.reply(409, text=str(e))
            if done is not None and not done.wait(30):
                return self.reply(409, text="not yet in effect")
            st = consumer.state()
            if consumer.broken == "ignore-stop" and msg.get("type") == "STOP":
                st["mode"] = HOLD  # the lie
            self.reply(200, st)

        def log_message(self, *args):
            pass

    host, _, port = listen.rpartition(":")
    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("MS2M_BROKER_URL", "amqp://guest:guest@localhost:5672/"))
    p.add_argument("--exchange", default=os.environ.get("MS2M_EXCHANGE", "ms2m"))
    p.add_argument("--queue", default=os.environ.get("MS2M_QUEUE", "ms2m.work"))
    p.add_argument("--listen", default=":8080")
    p.add_argument("--work", default="0ms", help="time to apply one message, e.g. 50ms")
    p.add_argument("--broken", default="", choices=["", "ignore-stop"], help="break the contract on purpose (to test a contract check)")
    a = p.parse_args()
    work = a.work.strip()
    work = float(work[:-2]) / 1000 if work.endswith("ms") else float(work.rstrip("s"))
    c = Consumer(a.url, a.exchange, a.queue, work, a.broken)
    if c.token is None:
        # Without a token anyone on the pod network could steer it.
        sys.exit("no MS2M control token at %s: mount the Secret ms2m-control (key token) of the pod's namespace there (docs/contract.md, \"Control token\")" % TOKEN_FILE)
    # As PID 1 the process would ignore SIGTERM, and a deleted pod (a
    # StatefulSet's migration deletes its stopped source) would linger its
    # whole grace period, all of it downtime (docs/contract.md, "Termination").
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    serve(c, a.listen)
    c.run()


if __name__ == "__main__":
    main()
