#!/usr/bin/env bash
# Latency across a namespace boundary, as one table from one run: `shmlink pong --latency
# -m 64` with the server and the client in containers emulated with namespaces (each in
# PID, mount, IPC and UTS namespaces of its own from `unshare`, inside one of two network
# namespaces joined by a veth pair):
#
#   shm: inside one container          server and client in the same namespaces (baseline)
#   shm: across containers             rendezvous directory shared by a bind mount
#   auto: across containers            the same directory shared: upgraded to shm
#   auto: over veth, no shared dir     the server's directory is a tmpfs of its own: TCP
#   tcp: over veth                     plain TCP between the network namespaces
#
# The transport column is what the client's connection reports; the script fails if a
# row did not take the path it should.
#
# Usage: sudo scripts/ns-pong.sh [CLIENT_OPTIONS...]
#   CLIENT_OPTIONS go to every client after `--latency -m 64` (say `-n 50000`); the
#   servers run with pong's defaults (with 2 or more CPUs: client on CPU 0, server on 1).
#   The binary is $SHMLINK if set, else a release build made here (`cargo build
#   --release`, honouring CARGO_TARGET_DIR).
#
# Root only. Everything it makes (network namespaces, a directory under /tmp, the
# containers and their processes) is removed on exit, also on failure or Ctrl-C. The
# veth addresses (10.199.0.1 and .2) exist only inside its own network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "ns-pong.sh: needs root (unshare, mount, ip netns)" >&2
  exit 2
fi
for tool in unshare:util-linux mount:mount ip:iproute2 timeout:coreutils; do
  if ! command -v "${tool%%:*}" >/dev/null; then
    echo "ns-pong.sh: needs ${tool%%:*} (Debian package ${tool#*:})" >&2
    exit 2
  fi
done

if [ -z "${SHMLINK:-}" ]; then
  cargo build --release --quiet -p shmlink-cli
  SHMLINK="${CARGO_TARGET_DIR:-$PWD/target}/release/shmlink"
fi
SHMLINK=$(realpath "$SHMLINK")

server_ip=10.199.0.1
client_ip=10.199.0.2
ns_server="shmlink-nspong-$$-server"
ns_client="shmlink-nspong-$$-client"
root=$(mktemp -d /tmp/shmlink-nspong.XXXXXX)
pids=()

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  # Killing `unshare` kills the container's first process (--kill-child), and with it
  # the whole PID namespace.
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  ip netns delete "$ns_server" 2>/dev/null || true
  ip netns delete "$ns_client" 2>/dev/null || true
  rm -rf "$root"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir "$root/shared" "$root/rdv"
servers_log="$root/servers.log"
export NSPONG_LOG="$servers_log"
chmod 700 "$root/shared"

ip netns add "$ns_server"
ip netns add "$ns_client"
ip link add veth-s netns "$ns_server" type veth peer name veth-c netns "$ns_client"
ip -n "$ns_server" addr add "$server_ip/24" dev veth-s
ip -n "$ns_client" addr add "$client_ip/24" dev veth-c
for ns in "$ns_server" "$ns_client"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns_server" link set veth-s up
ip -n "$ns_client" link set veth-c up

# container NETNS DIR: sets CONTAINER to the command prefix that runs a command in a
# container inside network namespace NETNS (new PID, mount, IPC and UTS namespaces);
# its rendezvous directory ($root/rdv, SHMLINK_DIR) is the shared directory (DIR=shared)
# or an empty tmpfs of its own (DIR=private).
container() {
  local mount
  case $2 in
    shared) mount="mount --bind '$root/shared' '$root/rdv'" ;;
    private) mount="mount -t tmpfs -o mode=0700,size=1m shmlink-nspong '$root/rdv'" ;;
  esac
  CONTAINER=(env "SHMLINK_DIR=$root/rdv" ip netns exec "$1"
    unshare --pid --fork --kill-child --mount-proc --mount --ipc --uts
    -- sh -c "$mount && exec \"\$@\"" container)
}

# server DIR ADDR: a server in its own container in the server's network namespace.
server() {
  container "$ns_server" "$1"
  "${CONTAINER[@]}" "$SHMLINK" pong --server "$2" 2>>"$servers_log" &
  pids+=($!)
}

server shared shm:pong
server shared "auto:$server_ip:7001"
server private "auto:$server_ip:7002"
server private "tcp:$server_ip:7003"

client_args=(--latency -m 64 "$@")
description=""
header=""
rows=()
failed=0

# row LABEL EXPECTED OUTPUT: adds the result row of one pong client run.
row() {
  local label=$1 expected=$2 out=$3 line transport
  line=$(printf '%s\n' "$out" | tail -n 1)
  [ -n "$description" ] || description=$(printf '%s\n' "$out" | grep '^# pong' || true)
  [ -n "$header" ] || header=$(printf '%s\n' "$out" | grep '^transport' || true)
  rows+=("$(printf '%-32s %s' "$label" "$line")")
  transport=${line%% *}
  if [ "$transport" != "$expected" ]; then
    echo "ns-pong.sh: $label ran on $transport, expected $expected" >&2
    failed=1
  fi
}

# measure LABEL EXPECTED NETNS DIR CMD...: runs CMD, a pong client, in a container of
# its own and adds its row.
measure() {
  local label=$1 expected=$2 out
  container "$3" "$4"
  shift 4
  if ! out=$(timeout --kill-after=5 300 "${CONTAINER[@]}" "$@"); then
    echo "ns-pong.sh: $label: the client failed; the servers' log:" >&2
    cat "$servers_log" >&2
    exit 1
  fi
  row "$label" "$expected" "$out"
}

# The baseline: its server runs in the client's container (and dies with the client,
# the container's first process).
measure "shm: inside one container" shm "$ns_server" shared sh -c \
  '"$0" pong --server shm:base 2>>"$NSPONG_LOG" & exec "$0" pong --client "$@" shm:base' \
  "$SHMLINK" "${client_args[@]}"
for case in "shm: across containers|shm|shm:pong" \
  "auto: across containers|shm|auto:$server_ip:7001" \
  "auto: over veth, no shared dir|tcp|auto:$server_ip:7002" \
  "tcp: over veth|tcp|tcp:$server_ip:7003"; do
  IFS='|' read -r label expected addr <<<"$case"
  measure "$label" "$expected" "$ns_client" shared \
    "$SHMLINK" pong --client "${client_args[@]}" "$addr"
done

echo "$description"
printf '%-32s %s\n' "case" "$header"
printf '%s\n' "${rows[@]}"
exit "$failed"
