#!/usr/bin/env bash
# Two or more builds of the bench, alternated: each round runs every build once (the
# order rotates from round to round, so no build always runs first), pinned on CPUs 0
# and 1 under `chrt -f 1`; then the median of every row's main figure (latency p50 or
# messages per second) per build, separately for the runs the bench found in the
# machine's fast vCPU placement, its slow one, or a mix (docs/benchmarks.md,
# "Placement"). For changes whose effect is smaller than a run's spread.
#
#   scripts/bench-ab.sh ROUNDS "BENCH ARGS" BINARY...
#
#   cp target/release/shmlink-bench /tmp/bench-before    # build, switch, build again
#   cp target/release/shmlink-bench /tmp/bench-after
#   scripts/bench-ab.sh 10 "--methods shmlink-shm --sizes 64 --mode both" \
#       /tmp/bench-before /tmp/bench-after
#
# A build is named by its file name; the runs' outputs stay in the directory printed last.
#
# Code placement alone moves some rows here (a 56 B round trip by 20 ns, a stream's rate
# by up to 20 %, between builds that differ only in code that never runs:
# docs/benchmarks.md, "Tenth round"). For effects that small, build every side with its
# functions and jump targets aligned, each tree into its own target directory (cargo
# takes a sibling checkout's crates in a shared one for its own):
#
#   RUSTFLAGS="-C llvm-args=-align-all-functions=6 -C llvm-args=-align-all-nofallthru-blocks=5" \
#       CARGO_TARGET_DIR=/tmp/ab-before cargo build --release -p shmlink-bench
set -euo pipefail
if [ $# -lt 3 ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
rounds=$1
read -ra args <<<"$2"
shift 2
builds=("$@")
for b in "${builds[@]}"; do
    [ -x "$b" ] || { echo "bench-ab: $b is not an executable" >&2; exit 2; }
done
dir=$(mktemp -d /tmp/bench-ab.XXXXXX)
n=${#builds[@]}
for r in $(seq "$rounds"); do
    for k in $(seq 0 $((n - 1))); do
        b=${builds[$(((k + r) % n))]}
        (cd "$dir" && chrt -f 1 "$b" "${args[@]}" --rounds 1 --cpus 0,1) \
            >"$dir/$(basename "$b").$r.txt" 2>&1 || { cat "$dir/$(basename "$b").$r.txt"; exit 1; }
    done
done
python3 - "$dir" <<'PY'
import collections, os, re, statistics, sys

runs = collections.defaultdict(list)


def number(text):
    scale = {"k": 1e3, "M": 1e6}.get(text[-1], 1)
    return float(text.rstrip("kM")) * scale


for name in sorted(os.listdir(sys.argv[1])):
    if not name.endswith(".txt"):
        continue
    build = name.rsplit(".", 2)[0]
    text = open(os.path.join(sys.argv[1], name)).read()
    probe = re.search(r"took (\d+)-(\d+) ns before and after each run", text)
    if probe and int(probe.group(2)) <= 123:
        place = "fast"
    elif probe and int(probe.group(1)) > 123:
        place = "slow"
    else:
        place = "mixed"
    table = None
    for line in text.splitlines():
        head = re.match(r"^(latency|throughput), (\S+ \S+):", line)
        if head:
            table = (head.group(1), head.group(2))
        elif not line.strip():
            table = None
        elif table and re.match(r"^\S+\s+[\d.]+[kM]?\s", line) and not line.startswith("method"):
            method, value = line.split()[:2]
            runs[(table, method, place, build)].append(number(value))

rows = sorted({key[:3] for key in runs})
for table, method, place in rows:
    cells = []
    for (t, m, p, build), values in sorted(runs.items()):
        if (t, m, p) == (table, method, place):
            cells.append(f"{build} {statistics.median(values):.4g} (n={len(values)})")
    print(f"{table[0]:<10} {table[1]:<7} {method:<20} {place:<5}  " + "  |  ".join(cells))
PY
echo "runs: $dir"
