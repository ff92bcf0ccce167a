#!/usr/bin/env bash
# The message brokers the pub/sub benchmark compares shmlink with (`shmlink-bench --pattern
# pubsub`, and the tests in crates/shmlink-bench/tests/brokers.rs): Redis and RabbitMQ,
# private instances on loopback, on ports of their own so that they never meet a broker the
# machine runs as a system service.
#
# Usage: scripts/brokers.sh install|start|stop|status
#   install  apt-get installs redis-server and rabbitmq-server (Debian 12; root). Their
#            system services are kept from starting during the installation (policy-rc.d);
#            if they run anyway they listen on the default ports, which these do not use.
#   start    starts both as root, bound to 127.0.0.1 only, and waits (with a deadline)
#            until each answers: Redis on PING, RabbitMQ on `rabbitmqctl await_startup`.
#            Prints the addresses. Already running: says so and leaves them.
#   stop     stops both (shutdown, then the pid from their pid files) and removes the state.
#   status   says what runs; exit status 0 when both run, 3 otherwise.
#
# SHMLINK_BROKERS_BIND=ADDR binds the Redis and AMQP listeners to ADDR instead (and lets
# guest log in from other hosts): `shmlink-bench --pattern remote` runs them this way in
# a private network namespace, reached over a veth pair. SHMLINK_BROKERS_DIR: the state.
#
# Addresses (the defaults of brokers::redis_addr / brokers::amqp_addr in shmlink-bench):
#   Redis      127.0.0.1:16379
#   RabbitMQ   127.0.0.1:15673 (AMQP 0-9-1, user guest/guest), node shmlink@localhost,
#              Erlang distribution on 127.0.0.1:25673, its own epmd on 127.0.0.1:14369
# State, logs, pid files and the Erlang cookie live in $SHMLINK_BROKERS_DIR (default
# /tmp/shmlink-brokers). Nothing is persisted: Redis saves no snapshot, RabbitMQ's
# database is deleted by `stop`.
set -euo pipefail

BASE=${SHMLINK_BROKERS_DIR:-/tmp/shmlink-brokers}
REDIS_PORT=16379
AMQP_PORT=15673
DIST_PORT=25673
EPMD_PORT=14369
NODE=shmlink@localhost
BIND=${SHMLINK_BROKERS_BIND:-127.0.0.1}
START_DEADLINE=${SHMLINK_BROKERS_DEADLINE:-120} # seconds, per broker

RABBIT_BIN=/usr/lib/rabbitmq/bin

log() { printf 'brokers.sh: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

# ---------------------------------------------------------------------------- install

cmd_install() {
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null &&
    [ -x "$RABBIT_BIN/rabbitmq-server" ] && [ -x "$RABBIT_BIN/rabbitmqctl" ]; then
    log "redis-server and rabbitmq-server are installed"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || die "install: needs root (apt-get)"
  command -v apt-get >/dev/null || die "install: needs apt-get (Debian 12)"

  # Keep the packages' services from starting during the installation: invoke-rc.d and
  # deb-systemd-invoke ask policy-rc.d, and 101 means "not allowed". An existing
  # policy-rc.d is left as it is.
  local policy=/usr/sbin/policy-rc.d made_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/brokers.sh install: no service starts\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi

  export DEBIAN_FRONTEND=noninteractive
  log "apt-get update"
  apt-get update -qq
  log "apt-get install redis-server rabbitmq-server"
  apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    redis-server redis-tools rabbitmq-server >/dev/null

  if [ -n "$made_policy" ]; then
    rm -f "$policy"
    trap - EXIT
  fi
  [ -x "$RABBIT_BIN/rabbitmq-server" ] || die "install: $RABBIT_BIN/rabbitmq-server missing after install"
  log "installed: $(redis-server --version | cut -d' ' -f1-3), rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server)"
}

# ---------------------------------------------------------------------------- redis

redis_pidfile() { echo "$BASE/redis/redis.pid"; }

redis_answers() {
  [ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
}

redis_start() {
  if redis_answers; then
    log "redis already running on 127.0.0.1:$REDIS_PORT"
    return 0
  fi
  command -v redis-server >/dev/null || die "redis-server not installed (scripts/brokers.sh install)"
  mkdir -p "$BASE/redis"
  # No snapshots, no append-only file; loopback only. A subscriber's output buffer may
  # grow to 1 GiB before Redis drops it (the default, 32 MiB, cuts off a benchmark's
  # subscriber that falls a few hundred 64 KiB messages behind).
  redis-server \
    --bind "$BIND" --port "$REDIS_PORT" --protected-mode "$([ "$BIND" = 127.0.0.1 ] && echo yes || echo no)" \
    --daemonize yes --pidfile "$(redis_pidfile)" \
    --logfile "$BASE/redis/redis.log" --dir "$BASE/redis" \
    --save '' --appendonly no \
    --client-output-buffer-limit 'pubsub 1gb 0 0' \
    --proto-max-bulk-len 64mb
  local deadline=$((SECONDS + START_DEADLINE))
  until redis_answers; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$BASE/redis/redis.log" >&2 || true
      die "redis did not answer PING on 127.0.0.1:$REDIS_PORT within ${START_DEADLINE}s"
    fi
    sleep 0.1
  done
}

redis_stop() {
  local pidfile pid
  pidfile=$(redis_pidfile)
  if redis_answers; then
    timeout 10 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  fi
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile")
    wait_gone "$pid" 10 || { kill -KILL "$pid" 2>/dev/null || true; }
    rm -f "$pidfile"
  fi
}

# ---------------------------------------------------------------------------- rabbitmq

# Everything RabbitMQ and its CLI read, in this process's environment: the node name and
# ports, where its state and logs go, and a HOME of its own for the Erlang cookie.
rabbit_env() {
  local dir=$BASE/rabbitmq
  export HOME=$dir/home
  export RABBITMQ_NODENAME=$NODE
  export RABBITMQ_USE_LONGNAME=false
  export RABBITMQ_NODE_IP_ADDRESS=$BIND
  export RABBITMQ_NODE_PORT=$AMQP_PORT
  export RABBITMQ_DIST_PORT=$DIST_PORT
  export ERL_EPMD_PORT=$EPMD_PORT
  export ERL_EPMD_ADDRESS=127.0.0.1
  export RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf
  export RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config
  export RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins
  export RABBITMQ_ENABLED_PLUGINS=
  export RABBITMQ_MNESIA_BASE=$dir/mnesia
  export RABBITMQ_LOG_BASE=$dir/log
  export RABBITMQ_PID_FILE=$dir/rabbitmq.pid
  # The distribution listener on loopback too.
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

rabbitmqctl() { timeout 30 "$RABBIT_BIN/rabbitmqctl" -n "$NODE" "$@"; }

rabbit_pid() {
  [ -f "$BASE/rabbitmq/rabbitmq.pid" ] && cat "$BASE/rabbitmq/rabbitmq.pid"
}

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
  timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# The AMQP port accepts connections (opened last during boot; a cheap first check, as each
# rabbitmqctl run boots an Erlang VM) and the node says it has started.
rabbit_answers() {
  [ -d "$BASE/rabbitmq/home" ] && port_open "$AMQP_PORT" || return 1
  (rabbit_env && rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1)
}

rabbit_start() {
  [ -x "$RABBIT_BIN/rabbitmq-server" ] || die "rabbitmq-server not installed (scripts/brokers.sh install)"
  if rabbit_answers; then
    log "rabbitmq already running on 127.0.0.1:$AMQP_PORT"
    return 0
  fi
  local dir=$BASE/rabbitmq
  mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
  if [ ! -s "$dir/home/.erlang.cookie" ]; then
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/home/.erlang.cookie")
  fi
  chmod 400 "$dir/home/.erlang.cookie"
  : >"$dir/rabbitmq-env.conf"
  echo '[].' >"$dir/enabled_plugins"
  echo '[].' >"$dir/advanced.config"
  cat >"$dir/rabbitmq.conf" <<EOF
listeners.tcp.1 = $BIND:$AMQP_PORT
loopback_users.guest = $([ "$BIND" = 127.0.0.1 ] && echo true || echo false)
log.console = false
log.file.level = warning
disk_free_limit.absolute = 50MB
EOF
  (
    rabbit_env
    # setsid: the node outlives this script and its terminal.
    setsid "$RABBIT_BIN/rabbitmq-server" >"$dir/log/stdout.log" 2>&1 </dev/null &
    echo $! >"$dir/launcher.pid"
  )
  local deadline=$((SECONDS + START_DEADLINE))
  until rabbit_answers; do
    if ! kill -0 "$(cat "$dir/launcher.pid")" 2>/dev/null; then
      tail -n 30 "$dir/log/stdout.log" >&2 || true
      die "rabbitmq-server exited during startup (logs in $dir/log)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 30 "$dir/log/stdout.log" >&2 || true
      die "rabbitmq did not start within ${START_DEADLINE}s (logs in $dir/log)"
    fi
    sleep 0.2
  done
}

rabbit_stop() {
  local dir=$BASE/rabbitmq pid launcher
  [ -d "$dir" ] || return 0
  pid=$(rabbit_pid || true)
  launcher=$(cat "$dir/launcher.pid" 2>/dev/null || true)
  if rabbit_answers; then
    (rabbit_env && rabbitmqctl -q stop >/dev/null 2>&1) || true
  fi
  for p in $pid $launcher; do
    wait_gone "$p" 30 || { kill -KILL "$p" 2>/dev/null || true; }
  done
  # The node started its own epmd on our port; it does not end with the node.
  if command -v epmd >/dev/null; then
    (rabbit_env && timeout 5 epmd -port "$EPMD_PORT" -kill >/dev/null 2>&1) || true
  fi
}

# ---------------------------------------------------------------------------- common

# wait_gone PID SECONDS: true once PID has exited (or was not running).
wait_gone() {
  local pid=$1 deadline=$((SECONDS + $2))
  [ -n "$pid" ] || return 0
  while kill -0 "$pid" 2>/dev/null; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

cmd_start() {
  [ "$(id -u)" -eq 0 ] || log "start: not root; continuing (files under $BASE)"
  mkdir -p "$BASE"
  local t0=$SECONDS
  redis_start
  log "redis answers ($((SECONDS - t0))s)"
  t0=$SECONDS
  rabbit_start
  log "rabbitmq answers ($((SECONDS - t0))s)"
  echo "redis    127.0.0.1:$REDIS_PORT    (SHMLINK_REDIS_ADDR)"
  echo "rabbitmq 127.0.0.1:$AMQP_PORT    (SHMLINK_AMQP_ADDR; AMQP 0-9-1, guest/guest)"
}

cmd_stop() {
  redis_stop
  rabbit_stop
  rm -rf "$BASE"
  log "stopped; $BASE removed"
}

cmd_status() {
  local up=0
  if redis_answers; then
    echo "redis    running on 127.0.0.1:$REDIS_PORT (pid $(cat "$(redis_pidfile)" 2>/dev/null || echo '?'))"
    up=$((up + 1))
  else
    echo "redis    not running (127.0.0.1:$REDIS_PORT)"
  fi
  if rabbit_answers; then
    echo "rabbitmq running on 127.0.0.1:$AMQP_PORT, node $NODE (pid $(rabbit_pid || echo '?'))"
    up=$((up + 1))
  else
    echo "rabbitmq not running (127.0.0.1:$AMQP_PORT)"
  fi
  [ "$up" -eq 2 ] || return 3
}

case "${1:-}" in
install) cmd_install ;;
start) cmd_start ;;
stop) cmd_stop ;;
status) cmd_status ;;
*)
  echo "usage: $0 install|start|stop|status" >&2
  exit 2
  ;;
esac
