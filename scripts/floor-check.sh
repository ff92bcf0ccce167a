#!/usr/bin/env bash
# Issue 17's four 64 B ratios from one interleaved run: the C floor (`floor-c`), the
# bench's shmlink rows and the library alone (`examples/pingpong`), round after round.
#
#   scripts/floor-check.sh [ROUNDS]        (default 3; the binaries are built first)
#
# Each round runs, one after the other, pinned on CPUs 0 and 1:
#   shmlink-bench --methods floor-c,shmlink-shm,shmlink-shm-batch --sizes 64 --mode both
#   pingpong                    (the library alone: 64 B round trips, p50)
#   pingpong --stream           (the library alone: 64 B messages streamed, one per publication)
#   pingpong --stream --batch 64
# and the table ends with the medians over the rounds and the ratios the issue sets goals
# for. Environment: WINDOW=N passes --window N to the bench (its default otherwise);
# RT=1 runs every process under `chrt -f 1` (root; on a machine shared with builds it
# keeps the scheduler from splitting a run, at the cost of those builds for a second or
# two per run). Numbers from a loaded machine are for the ratios within a round only.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
cargo build --release -q -p shmlink-bench -p shmlink --example pingpong
bench=target/release/shmlink-bench
pp=target/release/examples/pingpong
rt=()
if [ "${RT:-0}" = 1 ]; then rt=(chrt -f 1); fi
win=()
if [ -n "${WINDOW:-}" ]; then win=(--window "$WINDOW"); fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Column of a CSV cell: method, mode, field number (5 = p50_ns, 10 = msgs_per_s).
cell() { awk -F, -v m="$1" -v mode="$2" -v f="$3" '$1 == m && $2 == mode { print $f }' "$tmp/b.csv"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

printf '%-5s %9s %9s %9s %9s | %9s %9s %9s %9s %9s\n' round floor-c shm-bench shm-batch pingpong \
    shm-bench shm-batch pp-stream pp-batch64 floor-c
printf '%-5s %39s | %49s\n' '' 'latency p50, ns' 'throughput, M msg/s'
for r in $(seq "$rounds"); do
    "${rt[@]}" "$bench" --methods floor-c,shmlink-shm,shmlink-shm-batch --sizes 64 --mode both \
        --rounds 1 --cpus 0,1 "${win[@]}" --csv "$tmp/b.csv" >"$tmp/b.out" 2>&1 ||
        { cat "$tmp/b.out"; exit 1; }
    lat=$("${rt[@]}" "$pp" "shm:floor-check-l$$" 200000 64)
    one=$("${rt[@]}" "$pp" --stream "shm:floor-check-s$$" 10000000 64)
    b64=$("${rt[@]}" "$pp" --stream --batch 64 "shm:floor-check-b$$" 10000000 64)
    ppl=$(sed -E 's/.* p50 ([0-9]+) ns.*/\1/' <<<"$lat")
    pps=$(sed -E 's/.*: ([0-9.]+) M msgs\/s.*/\1/' <<<"$one")
    ppb=$(sed -E 's/.*: ([0-9.]+) M msgs\/s.*/\1/' <<<"$b64")
    m() { awk -v x="$1" 'BEGIN { printf "%.2f", x / 1e6 }'; }
    row=("$(cell floor-c latency 5)" "$(cell shmlink-shm latency 5)" "$(cell shmlink-shm-batch latency 5)" "$ppl"
        "$(m "$(cell shmlink-shm throughput 10)")" "$(m "$(cell shmlink-shm-batch throughput 10)")" "$pps" "$ppb"
        "$(m "$(cell floor-c throughput 10)")")
    printf '%-5s %9s %9s %9s %9s | %9s %9s %9s %9s %9s\n' "$r" "${row[@]}"
    printf '%s\n' "${row[*]}" >>"$tmp/rows"
done
col() { awk -v c="$1" '{ print $c }' "$tmp/rows" | median; }
med=()
for c in 1 2 3 4 5 6 7 8 9; do med+=("$(col "$c")"); done
printf '%-5s %9s %9s %9s %9s | %9s %9s %9s %9s %9s\n' median "${med[@]}"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "library alone p50 / floor-c p50                  $(ratio "${med[3]}" "${med[0]}")x   (goal <= 1.3)"
echo "bench shmlink-shm p50 / library alone p50        $(ratio "${med[1]}" "${med[3]}")x   (goal <= 1.15)"
echo "library alone streaming, per message / batch 64  ${med[6]} / ${med[7]} M msg/s   (goal >= 40)"
echo "bench shmlink-shm / pingpong --stream            $(ratio "${med[4]}" "${med[6]}")x   (goal >= 0.8)"
echo "bench shmlink-shm-batch / pingpong --batch 64    $(ratio "${med[5]}" "${med[7]}")x   (goal >= 0.8)"
