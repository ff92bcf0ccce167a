#!/usr/bin/env bash
# The project's test command (README quick start; .ci/run calls it): every unit,
# integration and doc test of the workspace, the loom model of the ring and its wake-up
# protocol, and a short run of each fuzz target.
# --long also runs the loom models marked #[ignore] (minutes each), the 1 GiB message test
# (crates/shmlink/tests/large.rs, ~3 GiB of memory) and fuzzes 5 min a target.
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
# Every skipped test appends a line here (shmlink_testkit::skip); SHMLINK_REQUIRE (say
# brokers,root,netns,nightly, as .ci/run sets it) turns the skips it names into failures.
SHMLINK_SKIP_LOG=$(mktemp)
export SHMLINK_SKIP_LOG
trap 'rm -f "$log" "$SHMLINK_SKIP_LOG"' EXIT

echo "== unit, integration and doc tests"
# Includes shmlink's tokio tests (tests/tokio_*.rs, ~2 min: the shmlink dev-dependency
# turns the feature on) and crates/shmlink-grpc's tonic tests.
# The preload library (a cdylib) and the shmlink binary that transparent mode's tests run:
# `cargo test` builds neither where the tests look for them (target/debug).
cargo build -p shmlink-preload -p shmlink-cli
# Includes the Zenoh bridge's tests (crates/shmlink-zenoh: network namespaces, ~55 s in debug);
# its interop tests use the official Python client in target/zenoh-venv, which
# scripts/zenoh.sh installs (.ci/run calls it; without it they skip as `zenoh-py`).
cargo test --workspace 2>&1 | tee -a "$log"
# The preload library's own unit tests (its lib target has `test = false`: in a test
# binary its exported read/write/... hooks replace the C library's for the harness too;
# they pass calls on fds they do not track straight through, so the tests run).
cargo test -p shmlink-preload --lib 2>&1 | tee -a "$log"
# The library without its default `tls` feature (no rustls): its unit tests, among them
# the one that asks for TLS and must be refused with an error naming the feature.
cargo test -p shmlink --no-default-features --features testing --lib 2>&1 | tee -a "$log"

echo "== the Python package: an abi3 manylinux_2_28 wheel + sdist (scripts/wheel.sh), auditwheel show, pytest in a clean venv without Rust on PATH"
# One release build of the extension, the wheel's; `scripts/python.sh` (pip install
# ./crates/shmlink-py, the README's way from source) builds the same code again.
scripts/wheel.sh 2>&1 | tee -a "$log"

echo "== the Debian package: built from scripts/install.sh's tree, dpkg -i, the install checks against /usr, dpkg -r (scripts/deb.sh test; root)"
scripts/deb.sh test 2>&1 | tee -a "$log"

echo "== hostile publisher geometries, release build (wrapping arithmetic is silent there)"
cargo test --release -p shmlink --test hostile_publisher 2>&1 | tee -a "$log"

if [ -n "$long" ]; then
  # The largest message the README promises (max_msg_size at its limit): #[ignore]d in a
  # plain run for its ~3 GiB of memory.
  echo "== the 1 GiB message limit (crates/shmlink/tests/large.rs, ignored test), release build"
  cargo test --release -p shmlink --test large -- --ignored 2>&1 | tee -a "$log"
fi

echo "== vm: between two QEMU guests and guest <-> host (scripts/vm-test.sh, ~45 s under TCG; skipped where QEMU cannot run)"
scripts/vm-test.sh 2>&1 | tee -a "$log"

echo "== loom models (SPSC + broadcast rings, wake-up protocols)${long:+, the ignored ones too}"
RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 CARGO_TARGET_DIR=target/loom \
  cargo test -p shmlink-ring --release loom ${long:+-- --include-ignored} 2>&1 | tee -a "$log"

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
  skip="SKIPPED scripts/test.sh::fuzz: needs a nightly toolchain, which this machine lacks [nightly]"
  case ",${SHMLINK_REQUIRE:-}," in
    *,nightly,* | *,all,*) echo "$skip, but SHMLINK_REQUIRE=$SHMLINK_REQUIRE"; exit 1 ;;
  esac
  echo "$skip" | tee -a "$SHMLINK_SKIP_LOG"
fi

# One closing line over every test binary above (each printed its own summary), then the
# skipped tests. libtest counts a skipped test as passed; here it moves to skipped.
# pytest (scripts/python.sh) counts its skips apart from its passes: its lines in the skip
# log (shmlink-py/pytest::) are not taken off the passed count, and its closing line
# ("== 23 passed, 1 skipped in 3.1s ==") adds passed, failed and errors.
awk 'FILENAME == ARGV[1] { sub(/^SKIPPED /, ""); sub(/: .*/, "")
    if (!($0 in seen)) { seen[$0]; n++; if ($0 !~ /^(scripts\/test\.sh|shmlink-py\/pytest)::/) t++ }; next }
  /^test result:/ { p += $4; f += $6; i += $8 }
  /^=+ [0-9]+ [a-z]+.* in [0-9.]+s/ { for (k = 2; k < NF; k++) { w = $(k + 1); sub(/,$/, "", w)
      if (w == "passed") p += $k; else if (w == "failed" || w ~ /^errors?$/) f += $k } }
  END { printf "all: %d passed, %d failed, %d skipped, %d ignored\n", p - t, f, n, i }' \
  "$SHMLINK_SKIP_LOG" "$log"
sort -u "$SHMLINK_SKIP_LOG" | sed 's/^SKIPPED /  skipped: /'
