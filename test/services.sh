#!/usr/bin/env bash
# Starts (up) or stops (down) the real services the integration tests use, on
# loopback only: RabbitMQ (Debian rabbitmq-server) and an OCI registry (Debian
# docker-registry); installs Debian's Python with pika for the Python
# consumer's contract check. Prints the environment the tests read.
set -euo pipefail
STATE=${MIGRATE_SERVICES_DIR:-/tmp/kubectl-migrate-services}
AMQP_PORT=${AMQP_PORT:-5672}
REGISTRY_ADDR=${REGISTRY_ADDR:-127.0.0.1:5000}

install() {
  command -v rabbitmq-server >/dev/null && command -v docker-registry >/dev/null && /usr/bin/python3 -c 'import pika' 2>/dev/null && return
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server docker-registry python3-minimal python3-pika >/dev/null
}

wait_for() { # wait_for SECONDS CMD...: poll a readiness command with a bound
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { echo "timed out waiting for: $*" >&2; return 1; }
    sleep 0.5
  done
}

up() {
  install
  mkdir -p "$STATE/rabbitmq" "$STATE/registry"
  chown rabbitmq:rabbitmq "$STATE/rabbitmq" # the server drops to this user
  if ! rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
    # epmd and Erlang distribution on loopback too.
    ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=$AMQP_PORT \
      RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000)) \
      RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
      RABBITMQ_LOG_BASE="$STATE/rabbitmq" rabbitmq-server -detached
  fi
  if ! [ -s "$STATE/registry/pid" ] || ! kill -0 "$(cat "$STATE/registry/pid")" 2>/dev/null; then
    cat > "$STATE/registry/config.yml" <<CFG
version: 0.1
storage:
  filesystem:
    rootdirectory: $STATE/registry/data
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
log:
  level: warn
CFG
    docker-registry serve "$STATE/registry/config.yml" >"$STATE/registry/log" 2>&1 &
    echo $! > "$STATE/registry/pid"
  fi
  wait_for 120 rabbitmq-diagnostics -q check_port_connectivity
  wait_for 30 curl -sf "http://$REGISTRY_ADDR/v2/"
  echo "export MIGRATE_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/"
  echo "export MIGRATE_TEST_REGISTRY=$REGISTRY_ADDR"
  echo "export MIGRATE_TEST_PYTHON=/usr/bin/python3" # Debian's, which has pika
}

down() {
  rabbitmqctl -q stop >/dev/null 2>&1 || true
  # The broker started epmd; it refuses to stop while any node is registered.
  ERL_EPMD_ADDRESS=127.0.0.1 epmd -kill >/dev/null 2>&1 || true
  if [ -s "$STATE/registry/pid" ]; then kill "$(cat "$STATE/registry/pid")" 2>/dev/null || true; rm -f "$STATE/registry/pid"; fi
}

"${1:-up}"
