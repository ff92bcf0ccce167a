#!/usr/bin/env bash
# Real programs for transparent mode (docs/transparent.md): installs them from Debian's
# packages and compares each plain (TCP over loopback) with the same program under
# `shmlink run` (shared memory).
#
# Usage: scripts/apps.sh install|bench
#   install  apt-get installs redis-server, redis-tools (redis-cli, redis-benchmark),
#            nginx, wrk, curl, iperf3, sockperf and memcached when missing (Debian 12; root). The packages' own
#            services are kept from starting (policy-rc.d); the tests and the bench run
#            private instances.
#   bench    builds libshmlink_preload.so (release), starts one redis-server under
#            `shmlink run` on a free loopback port, and runs redis-benchmark -t set,get
#            with -c 1 and with -c 50 -P 16, plain and preloaded, alternating (REPEAT
#            rounds, best of each); then nginx (one process) with wrk -c 1 and -c 64 on
#            a 4 KiB file, and iperf3 (one stream), the same way. Prints: program,
#            metric, TCP, shmlink, ratio.
#            Numbers from a machine where other work runs are noise: say so with them.
# Env: REPEAT (default 3), REQUESTS (default 100000), SHMLINK_SPIN_US (passed through).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'apps.sh: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

cmd_install() {
  if command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null &&
    command -v redis-cli >/dev/null && command -v nginx >/dev/null &&
    command -v wrk >/dev/null && command -v curl >/dev/null && command -v iperf3 >/dev/null &&
    command -v sockperf >/dev/null && command -v memcached >/dev/null; then
    log "redis-server, redis-cli, redis-benchmark, nginx, wrk, curl, iperf3, sockperf and memcached are installed"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || die "install: needs root (apt-get)"
  command -v apt-get >/dev/null || die "install: needs apt-get (Debian)"
  local policy=/usr/sbin/policy-rc.d made_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/apps.sh install: no service starts\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    redis-server redis-tools nginx wrk curl iperf3 sockperf memcached
  if [ -n "$made_policy" ]; then rm -f "$policy"; fi
  local p
  for p in redis-benchmark nginx wrk curl iperf3 sockperf memcached; do
    command -v "$p" >/dev/null || die "install: $p still missing"
  done
}

# Prints the best requests/s of TEST (SET or GET) in redis-benchmark -q output on stdin.
rate_of() {
  tr '\r' '\n' | awk -v t="$1" -F': ' '$1 == t && /requests per second/ { split($2, a, " "); print a[1] }' | tail -1
}

cmd_bench() {
  command -v redis-server >/dev/null || die "bench: redis-server is not installed (scripts/apps.sh install)"
  cargo build --release -q -p shmlink-preload -p shmlink-cli
  local shmlink=target/release/shmlink repeat=${REPEAT:-3} n=${REQUESTS:-100000}
  local port
  dir=$(mktemp -d)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  export SHMLINK_DIR="$dir/rdv"
  "$shmlink" run -- redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$dir" >"$dir/server.log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
  for _ in $(seq 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -p "$port" ping >/dev/null || die "bench: redis-server did not start ($dir/server.log)"
  printf '%-34s %-6s %14s %14s %7s\n' program metric "TCP req/s" "shmlink req/s" ratio
  local args
  for args in "-c 1" "-c 50 -P 16"; do
    local best_tcp_set=0 best_tcp_get=0 best_shm_set=0 best_shm_get=0 out r
    for _ in $(seq "$repeat"); do
      # shellcheck disable=SC2086 # $args is a list of options
      out=$(redis-benchmark -p "$port" -t set,get -n "$n" $args -q 2>&1)
      r=$(rate_of SET <<<"$out"); best_tcp_set=$(awk -v a="$best_tcp_set" -v b="$r" 'BEGIN{print (b>a)?b:a}')
      r=$(rate_of GET <<<"$out"); best_tcp_get=$(awk -v a="$best_tcp_get" -v b="$r" 'BEGIN{print (b>a)?b:a}')
      # shellcheck disable=SC2086
      out=$("$shmlink" run -- redis-benchmark -p "$port" -t set,get -n "$n" $args -q 2>&1)
      r=$(rate_of SET <<<"$out"); best_shm_set=$(awk -v a="$best_shm_set" -v b="$r" 'BEGIN{print (b>a)?b:a}')
      r=$(rate_of GET <<<"$out"); best_shm_get=$(awk -v a="$best_shm_get" -v b="$r" 'BEGIN{print (b>a)?b:a}')
    done
    awk -v p="redis-benchmark $args" -v m=SET -v t="$best_tcp_set" -v s="$best_shm_set" \
      'BEGIN { printf "%-34s %-6s %14.0f %14.0f %7.2f\n", p, m, t, s, (t > 0) ? s / t : 0 }'
    awk -v p="redis-benchmark $args" -v m=GET -v t="$best_tcp_get" -v s="$best_shm_get" \
      'BEGIN { printf "%-34s %-6s %14.0f %14.0f %7.2f\n", p, m, t, s, (t > 0) ? s / t : 0 }'
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
  trap - EXIT
}

# The larger of two numbers, and one table row.
best() { awk -v a="$1" -v b="$2" 'BEGIN { print (b + 0 > a + 0) ? b : a }'; }
row() {
  awk -v p="$1" -v m="$2" -v t="$3" -v s="$4" \
    'BEGIN { printf "%-34s %-6s %14.0f %14.0f %7.2f\n", p, m, t, s, (t > 0) ? s / t : 0 }'
}

# nginx in one process (master_process off, as in the earlier tables; its master and
# workers take shared memory too, see tests/apps.rs), wrk -c 1 and -c 64 on a 4 KiB
# file, plain and under `shmlink run`.
cmd_bench_nginx() {
  if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
    log "bench: nginx or wrk is not installed (scripts/apps.sh install): nginx rows skipped"
    return 0
  fi
  local shmlink=target/release/shmlink repeat=${REPEAT:-3}
  ndir=$(mktemp -d)
  local nport
  nport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$ndir/www" "$ndir/tmp"
  head -c 4096 /dev/urandom >"$ndir/www/f4k"
  printf '%s\n' "daemon off;" "master_process off;" "worker_processes 1;" \
    "error_log $ndir/error.log;" "pid $ndir/nginx.pid;" \
    "events { worker_connections 1024; }" \
    "http { access_log off; sendfile on; client_body_temp_path $ndir/tmp;" \
    "  proxy_temp_path $ndir/tmp; fastcgi_temp_path $ndir/tmp; uwsgi_temp_path $ndir/tmp;" \
    "  scgi_temp_path $ndir/tmp;" \
    "  server { listen 127.0.0.1:$nport; root $ndir/www; } }" >"$ndir/nginx.conf"
  SHMLINK_DIR="$ndir/rdv" "$shmlink" run -- nginx -c "$ndir/nginx.conf" -p "$ndir" &
  npid=$!
  trap 'kill "$npid" 2>/dev/null || true; wait "$npid" 2>/dev/null || true; rm -rf "$ndir"' EXIT
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$nport/f4k" && break
    sleep 0.1
  done
  local c tcp shm out r
  for c in 1 64; do
    tcp=0 shm=0
    for _ in $(seq "$repeat"); do
      out=$(wrk -t1 -c"$c" -d3s "http://127.0.0.1:$nport/f4k" 2>&1)
      r=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
      tcp=$(best "$tcp" "${r:-0}")
      out=$(SHMLINK_DIR="$ndir/rdv" "$shmlink" run -- wrk -t1 -c"$c" -d3s "http://127.0.0.1:$nport/f4k" 2>&1)
      r=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
      shm=$(best "$shm" "${r:-0}")
    done
    row "wrk -c $c (nginx, 4 KiB file)" "req/s" "$tcp" "$shm"
  done
}

# iperf3, one stream, 3 s, plain and under `shmlink run` (the server preloaded).
cmd_bench_iperf() {
  if ! command -v iperf3 >/dev/null; then
    log "bench: iperf3 is not installed (scripts/apps.sh install): iperf3 row skipped"
    return 0
  fi
  local shmlink=target/release/shmlink repeat=${REPEAT:-3} idir iport tcp=0 shm=0 r
  idir=$(mktemp -d)
  for _ in $(seq "$repeat"); do
    for mode in tcp shm; do
      iport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
      SHMLINK_DIR="$idir/rdv" "$shmlink" run -- timeout 30 iperf3 -s -1 -p "$iport" >/dev/null 2>&1 &
      local ipid=$!
      for _ in $(seq 50); do
        [ -n "$(find "$idir/rdv" -name "tcp-*-$iport.sock" 2>/dev/null)" ] && break
        sleep 0.1
      done
      if [ "$mode" = tcp ]; then
        r=$(timeout 30 iperf3 -c 127.0.0.1 -p "$iport" -t 3 -J 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' 2>/dev/null || echo 0)
        tcp=$(best "$tcp" "$r")
      else
        r=$(SHMLINK_DIR="$idir/rdv" "$shmlink" run -- timeout 30 iperf3 -c 127.0.0.1 -p "$iport" -t 3 -J 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"])' 2>/dev/null || echo 0)
        shm=$(best "$shm" "$r")
      fi
      wait "$ipid" 2>/dev/null || true
    done
  done
  rm -rf "$idir"
  row "iperf3 (one stream)" "Mbit/s" "$(awk -v v="$tcp" 'BEGIN{print v/1e6}')" "$(awk -v v="$shm" 'BEGIN{print v/1e6}')"
}

case "${1:-}" in
  install) cmd_install ;;
  bench)
    cmd_bench
    cmd_bench_nginx
    cmd_bench_iperf
    ;;
  *)
    echo "usage: $0 install|bench" >&2
    exit 2
    ;;
esac
