#!/usr/bin/env bash
# shmlink pong between two QEMU guests over vm: (the shared ivshmem region) and over tcp:
# (virtio-net between the guests), same boot, then guest ↔ host over vm:. Prints the
# tables, one `shmlink pong --json` line per run, and the vm:/tcp: ratios.
#
#   scripts/vm-pong.sh [--count N] [--timeout S] [--region-mib N]
#
# The region defaults to 256 MiB: 1 MiB rings, so a 1 MiB message is 2 fragments.
#
# Under TCG (this machine: nested KVM hangs) absolute numbers mean little: compare the
# ratio. On a KVM host the same script uses KVM (scripts/vm.sh accel). docs/vms.md.
set -euo pipefail
cd "$(dirname "$0")/.."
count=2000 timeout=300 mib=256
while [ $# -gt 0 ]; do
  case $1 in
    --count) count=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --region-mib) mib=$2; shift 2 ;;
    *) sed -n '2,11p' "$0"; exit 2 ;;
  esac
done
scripts/vm.sh install >/dev/null
scripts/vm.sh image >/dev/null
bin=$PWD/target/release/shmlink
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# Guest a serves vm:pong and tcp:0.0.0.0:7000 until guest b says it is done (nc on 9000).
# Guest b measures both in one table (latency 64 B, then throughput 1 MiB), then the same
# as JSON lines. The host serves vm:hostpong in the region while the guests run; guest b
# measures it after the guest ↔ guest runs.
a='shmlink pong --server vm:pong >/tmp/s1 2>&1 &
shmlink pong --server tcp:0.0.0.0:7000 >/tmp/s2 2>&1 &
nc -l -p 9000 >/dev/null
kill %1 %2 2>/dev/null; wait; cat /tmp/s1 /tmp/s2'
b="sleep 2
set -e
shmlink pong --client --cpus none --latency -n $count vm:pong tcp:192.0.2.1:7000
shmlink pong --client --cpus none -m 1M -n 200 vm:pong tcp:192.0.2.1:7000
shmlink pong --client --cpus none --latency -n $count --json vm:pong tcp:192.0.2.1:7000
shmlink pong --client --cpus none -m 1M -n 200 --json vm:pong tcp:192.0.2.1:7000
echo '# guest <-> host over vm: (the host serves in the region)'
shmlink pong --client --cpus none --latency -n $count vm:hostpong
shmlink pong --client --cpus none --latency -n $count --json vm:hostpong
shmlink pong --client --cpus none -m 1M -n 200 --json vm:hostpong
echo done | nc 192.0.2.1 9000"
# The host's server runs until both guests are done (scripts/vm.sh sends it SIGTERM).
host="exec $bin pong --server vm:hostpong@\$SHMLINK_VM_REGION"
set +e
scripts/vm.sh run --timeout "$timeout" --region-mib "$mib" --a "$a" --b "$b" --host "$host" | tee "$out"
rc=${PIPESTATUS[0]}
set -e
python3 - "$out" <<'EOF'
import json, sys
rows, host = [], []
cur = rows
for l in open(sys.argv[1]):
    if l.startswith("# guest <-> host"):
        cur = host  # what follows is guest <-> host
    elif l.startswith('{"transport"'):
        cur.append(json.loads(l))
lat = {r["transport"]: r for r in rows if r["window"] == 1}
thr = {r["transport"]: r for r in rows if r["window"] != 1}
print("# ratios, guest <-> guest (same boot)")
if "vm" in lat and "tcp" in lat:
    v, t = lat["vm"]["rtt_ns"]["p50"], lat["tcp"]["rtt_ns"]["p50"]
    print(f"64 B round trip p50: vm {v/1000:.1f} us, tcp {t/1000:.1f} us: tcp/vm = {t/v:.1f}x")
if "vm" in thr and "tcp" in thr:
    v, t = thr["vm"]["bytes_per_s"], thr["tcp"]["bytes_per_s"]
    print(f"1 MiB throughput: vm {v/2**20:.1f} MiB/s, tcp {t/2**20:.1f} MiB/s: vm/tcp = {v/t:.1f}x")
for r in host:
    if r["window"] == 1:
        print(f"guest <-> host vm: 64 B round trip p50 {r['rtt_ns']['p50']/1000:.1f} us")
    else:
        print(f"guest <-> host vm: 1 MiB throughput {r['bytes_per_s']/2**20:.1f} MiB/s")
EOF
exit "$rc"
