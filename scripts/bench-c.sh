#!/usr/bin/env bash
# The C bench (docs/c.md, README): shmlink shm: from C against what C programs would
# otherwise use, an AF_UNIX SOCK_SEQPACKET socket pair and a pipe, plus the Rust API alone
# (crates/shmlink/examples/pingpong.rs) in the same run, to check "C within 1.1x of Rust
# at 64 B". Round trips (p50/p99, ns) and one-way throughput of 64 B and 64 KiB messages,
# both processes pinned cross-core (CPUs 0,1) and same-core (0,0).
#
#   scripts/bench-c.sh [--quick]     (--quick: 1/20 of the counts, for a smoke run)
#
# Release builds; the library is installed to target/capi/bench-prefix and the bench
# compiled against it through pkg-config, as a C user would.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=
[[ ${1:-} == --quick ]] && quick=--quick
prefix=target/capi/bench-prefix
scripts/capi.sh install "$prefix" >&2
export PKG_CONFIG_PATH=$PWD/$prefix/lib/pkgconfig
bin=target/capi/bench-c
# shellcheck disable=SC2046
cc -std=c11 -O2 -Wall -Wextra -Werror crates/shmlink-capi/bench/bench.c -o "$bin" \
  $(pkg-config --cflags --libs shmlink) -Wl,-rpath,"$(pkg-config --variable=libdir shmlink)"
cargo build -q --release -p shmlink --example pingpong >&2
export SHMLINK_DIR=${SHMLINK_DIR:-$(mktemp -d)}

cpus=$(nproc)
echo "C bench, $(date -u +%Y-%m-%dT%H:%MZ), $cpus CPUs ($(uname -r)); ns per round trip, throughput one way${quick:+ (--quick: 1/20 of the counts)}"
echo
echo "| method | CPUs | 64 B p50 | 64 B p99 | 64 KiB p50 | 64 KiB p99 | 64 B M msgs/s | 64 KiB GB/s |"
echo "|---|---|---|---|---|---|---|---|"
pins=("0,1")
[[ $cpus -ge 1 ]] && pins+=("0,0")
for p in "${pins[@]}"; do
  "$bin" --cpus "$p" $quick
done
echo
# The Rust API alone (examples/pingpong.rs pins itself to CPUs 0 and 1), 64 B round
# trips, alternating with the same measurement from C three times: the ratio of the
# medians is the "C within 1.1x of Rust" check (noise moves both the same way).
count=200000
[[ -n $quick ]] && count=10000
c=() r=()
for _ in 1 2 3; do
  c+=("$("$bin" --cpus 0,1 --p50-64 "$count")")
  r+=("$(target/release/examples/pingpong "shm:bench-rust-$$" "$count" | sed -n 's/.* p50 \([0-9]*\) ns.*/\1/p')")
done
median() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
echo "64 B round trip p50 over shm: (CPUs 0,1), 3 alternating runs of $count:"
echo "    C API (shmlink_send/shmlink_recv): ${c[*]} ns, median $(median "${c[@]}")"
echo "    Rust API (examples/pingpong.rs):   ${r[*]} ns, median $(median "${r[@]}")"
awk -v c="$(median "${c[@]}")" -v r="$(median "${r[@]}")" \
  'BEGIN { printf "    C / Rust: %.3fx (target: within 1.1x)\n", c / r }'
