#!/usr/bin/env bash
# The 64 B yardstick from one interleaved run: the physical floor (`floor-line`: one
# cache line per direction), the C ring (`floor-c`), the bench's shmlink rows, the
# library alone (`examples/pingpong`) and `shmlink pong`, round after round.
#
#   scripts/floor-check.sh [ROUNDS]        (default 5; the binaries are built first)
#
# Each round runs, one after the other, pinned on CPUs 0 and 1:
#   shmlink-bench --methods floor-line,floor-c,shmlink-shm,shmlink-shm-batch --sizes 64 --mode both
#   shmlink-bench --methods floor-line --sizes 56 --mode latency
#   pingpong                    (the library alone: 64 B round trips, p50)
#   pingpong, 56 B              (a message that fits one line with its 8-byte record header)
#   shmlink pong --latency      (the operator's tool, sampled verification as the bench)
#   pingpong --stream           (the library alone: 64 B messages streamed, one per publication)
#   pingpong --stream --batch 64
# and the table ends with the medians over the rounds and the ratios issue 36 sets goals
# for. The machine's vCPU placement is bimodal (a line transfer costs about twice as much
# in one mode): the rounds interleave everything, so each round's ratios hold within it.
# Environment: WINDOW=N passes --window N to the bench (its default otherwise); RT=1 runs
# every process under `chrt -f 1` (root; on a machine shared with builds it keeps the
# scheduler from splitting a run, at the cost of those builds for a second or two per
# run).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo build --release -q -p shmlink-bench -p shmlink-cli -p shmlink --bins --example pingpong
bench=target/release/shmlink-bench
pp=target/release/examples/pingpong
cli=target/release/shmlink
rt=()
if [ "${RT:-0}" = 1 ]; then rt=(chrt -f 1); fi
win=()
if [ -n "${WINDOW:-}" ]; then win=(--window "$WINDOW"); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Column of a CSV cell: method, mode, field number (5 = p50_ns, 10 = msgs_per_s), and
# the file (default the 64 B run's).
cell() { awk -F, -v m="$1" -v mode="$2" -v f="$3" '$1 == m && $2 == mode { print $f }' "${4:-$tmp/b.csv}"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m() { awk -v x="$1" 'BEGIN { printf "%.2f", x / 1e6 }'; }

cols=(floor-line floor-c shm-bench shm-batch pingpong pong shm-bench shm-batch pp-stream pp-batch64
    line-56 pp-56)
fmt='%-6s %10s %9s %9s %9s %9s %9s | %9s %9s %9s %10s | %8s %8s\n'
printf "$fmt" round "${cols[@]}"
printf '%-6s %59s | %40s | %17s\n' '' 'latency p50, ns (64 B)' 'throughput, M msg/s (64 B)' '56 B p50, ns'
for r in $(seq "$rounds"); do
    "${rt[@]}" "$bench" --methods floor-line,floor-c,shmlink-shm,shmlink-shm-batch --sizes 64 \
        --mode both --rounds 1 --cpus 0,1 "${win[@]}" --csv "$tmp/b.csv" >"$tmp/b.out" 2>&1 ||
        { cat "$tmp/b.out"; exit 1; }
    "${rt[@]}" "$bench" --methods floor-line --sizes 56 --mode latency --rounds 1 --cpus 0,1 \
        --csv "$tmp/b56.csv" >"$tmp/b56.out" 2>&1 || { cat "$tmp/b56.out"; exit 1; }
    lat=$("${rt[@]}" "$pp" "shm:floor-check-l$$" 200000 64)
    lat56=$("${rt[@]}" "$pp" "shm:floor-check-m$$" 200000 56)
    pong=$("${rt[@]}" "$cli" pong --latency -n 200000 --cpus 0,1 --json "shm:floor-check-p$$")
    one=$("${rt[@]}" "$pp" --stream "shm:floor-check-s$$" 10000000 64)
    b64=$("${rt[@]}" "$pp" --stream --batch 64 "shm:floor-check-b$$" 10000000 64)
    row=("$(cell floor-line latency 5)" "$(cell floor-c latency 5)"
        "$(cell shmlink-shm latency 5)" "$(cell shmlink-shm-batch latency 5)"
        "$(sed -E 's/.* p50 ([0-9]+) ns.*/\1/' <<<"$lat")"
        "$(sed -E 's/.*"p50":([0-9.]+).*/\1/' <<<"$pong")"
        "$(m "$(cell shmlink-shm throughput 10)")" "$(m "$(cell shmlink-shm-batch throughput 10)")"
        "$(sed -E 's/.*: ([0-9.]+) M msgs\/s.*/\1/' <<<"$one")"
        "$(sed -E 's/.*: ([0-9.]+) M msgs\/s.*/\1/' <<<"$b64")"
        "$(cell floor-line latency 5 "$tmp/b56.csv")"
        "$(sed -E 's/.* p50 ([0-9]+) ns.*/\1/' <<<"$lat56")")
    printf "$fmt" "$r" "${row[@]}"
    printf '%s\n' "${row[*]}" >>"$tmp/rows"
done
col() { awk -v c="$1" '{ print $c }' "$tmp/rows" | median; }
med=()
for c in $(seq 1 ${#cols[@]}); do med+=("$(col "$c")"); done
printf "$fmt" median "${med[@]}"
# Ratios of medians, and the median of each round's ratio (robust to a placement change
# between rounds).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
per_round() { awk -v a="$1" -v b="$2" '{ printf "%.4f\n", $a / $b }' "$tmp/rows" | median; }
echo
echo "library alone p50 / floor-line p50     $(ratio "${med[4]}" "${med[0]}")x, per round $(per_round 5 1)x   (goal <= 1.3)"
echo "  the same at 56 B (one line with its header)  $(ratio "${med[11]}" "${med[10]}")x, per round $(per_round 12 11)x"
echo "pong p50 / library alone p50           $(ratio "${med[5]}" "${med[4]}")x, per round $(per_round 6 5)x   (goal <= 1.15)"
echo "bench shmlink-shm p50 / library alone  $(ratio "${med[2]}" "${med[4]}")x, per round $(per_round 3 5)x"
echo "floor-c p50 / floor-line p50           $(ratio "${med[1]}" "${med[0]}")x"
echo "library alone streaming, per message / batch 64  ${med[8]} / ${med[9]} M msg/s"
