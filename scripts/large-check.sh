#!/usr/bin/env bash
# Large messages against iceoryx2, like with like (issue 36): the copying rows
# (`shmlink-shm`, `iceoryx2`: both copy in and copy out) and the zero-copy rows
# (`shmlink-shm-zc`, `iceoryx2-zc`) at 64 KiB, 1 MiB and 4 MiB, latency and throughput,
# interleaved in ROUNDS rounds, pinned on CPUs 0 and 1; then, per pair and cell, the
# rounds won in all rounds and among the rounds in which both runs had the same vCPU
# placement (the bench probes a bare line round trip before and after every run and
# sorts the runs into a fast and a slow placement: docs/benchmarks.md, "Placement"),
# with the median ratio of each placement's runs.
#
#   scripts/large-check.sh [ROUNDS]     (default 12; RT=1: under `chrt -f 1`; JSON=FILE
#                                        keeps the bench's report; SIZES=64k,1m,4m and
#                                        MODES=both are the defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-12}
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo build --release -q -p shmlink-bench --bins
rt=()
if [ "${RT:-0}" = 1 ]; then rt=(chrt -f 1); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
json=${JSON:-$tmp/large.json}
"${rt[@]}" target/release/shmlink-bench --methods shmlink-shm,shmlink-shm-zc,iceoryx2,iceoryx2-zc \
    --sizes "${SIZES:-64k,1m,4m}" --mode "${MODES:-both}" --rounds "$rounds" --cpus 0,1 --json "$json"
python3 - "$json" <<'EOF'
import json, statistics, sys

report = json.load(open(sys.argv[1]))
cells = {(c["method"], c["mode"], c["size"]): c["runs"] for c in report["results"]}
pairs = [("shmlink-shm", "iceoryx2"), ("shmlink-shm-zc", "iceoryx2-zc")]


def head(run, mode):
    return run["rtt_ns"]["p50"] if mode == "latency" else run["msgs_per_s"]


def better(a, b, mode):
    return a < b if mode == "latency" else a > b


print("\nrounds won (and the median of the runs' ratio, >1 = shmlink faster)")
print(f"{'cell':<24} {'pair':<30} {'all':>11} {'fast placement':>22} {'slow placement':>22}")
for mode in ("latency", "throughput"):
    for size in sorted({k[2] for k in cells}):
        for a, b in pairs:
            ra, rb = cells.get((a, mode, size)), cells.get((b, mode, size))
            if not ra or not rb:
                continue
            cols = []
            for place in (None, "fast", "slow"):
                both = [
                    (x, y)
                    for x, y in zip(ra, rb)
                    if place is None or x.get("placement") == y.get("placement") == place
                ]
                if not both:
                    cols.append("-")
                    continue
                won = sum(better(head(x, mode), head(y, mode), mode) for x, y in both)
                speed = [
                    head(y, mode) / head(x, mode) if mode == "latency" else head(x, mode) / head(y, mode)
                    for x, y in both
                ]
                cols.append(f"{won}/{len(both)} {statistics.median(speed):.2f}x")
            cell = f"{mode} {size >> 10} KiB"
            print(f"{cell:<24} {a + ' vs ' + b:<30} {cols[0]:>11} {cols[1]:>22} {cols[2]:>22}")
EOF
