#!/usr/bin/env bash
# The project's test command (README quick start; .ci/run calls it): every unit,
# integration and doc test of the workspace, the loom model of the ring and its wake-up
# protocol, and a short run of each fuzz target.
# --long also runs the loom models marked #[ignore] (minutes each) and fuzzes 5 min a target.
set -euo pipefail
cd "$(dirname "$0")/.."
long=
for arg in "$@"; do
  case $arg in
    --long) long=1 ;;
    *) echo "usage: $0 [--long]" >&2; exit 2 ;;
  esac
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT

echo "== unit, integration and doc tests"
cargo test --workspace 2>&1 | tee -a "$log"

echo "== hostile publisher geometries, release build (wrapping arithmetic is silent there)"
cargo test --release -p shmlink --test hostile_publisher 2>&1 | tee -a "$log"

echo "== loom models (ring + wake-up protocol)${long:+, the ignored ones too}"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
  cargo test -p shmlink --lib --release loom ${long:+-- --include-ignored} 2>&1 | tee -a "$log"

: "${FUZZ_SECONDS:=${long:+300}}"
echo "== fuzz targets, ${FUZZ_SECONDS:=30} s each (longer: FUZZ_SECONDS=600 scripts/test.sh)"
# Each run starts from the tracked seeds (fuzz/seeds/TARGET, read only) and writes what
# it finds to the ignored fuzz/corpus/TARGET. To refresh the seeds after changing a
# parser: fuzz a few minutes, put the finds into the seeds, minimize them in place, and
# commit the result (keep it to a few hundred KB):
#   cd crates/shmlink/fuzz && cargo +nightly fuzz run -O T corpus/T seeds/T -- -max_total_time=300
#   cp corpus/T/* seeds/T/ && cargo +nightly fuzz cmin -O T seeds/T
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
  for target in handshake pubsub_handshake shm_reader pubsub_reader; do
    # A build failure, a crash or a run that never reports its end fails the step.
    out=crates/shmlink/fuzz/last-run-$target.log
    if ! (cd crates/shmlink/fuzz && mkdir -p "corpus/$target" &&
      cargo +nightly fuzz run -O "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 >"last-run-$target.log" 2>&1); then
      tail -40 "$out"; echo "fuzz target $target failed (build or crash), log: $out"
      exit 1
    fi
    if ! grep -E '^Done [0-9]+ runs' "$out"; then
      tail -40 "$out"; echo "fuzz target $target ended without 'Done N runs', log: $out"
      exit 1
    fi
    if compgen -G "crates/shmlink/fuzz/artifacts/$target/*" >/dev/null; then
      echo "fuzz target $target found a crash:"; ls "crates/shmlink/fuzz/artifacts/$target"
      exit 1
    fi
  done
else
  echo "SKIPPED fuzz targets: they need a nightly toolchain, and this machine has none"
fi

# One closing line over every test binary above (each printed its own summary).
awk '/^test result:/ { p += $4; f += $6 } END { printf "all: %d passed, %d failed\n", p, f }' "$log"
