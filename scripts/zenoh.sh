#!/usr/bin/env bash
# What the Zenoh bridge's interop tests (crates/shmlink-zenoh/tests/interop.rs) need:
# the official Python client, eclipse-zenoh from PyPI (pinned to the Rust crate's minor
# version), in a venv under target/. .ci/run calls it; the tests skip (requirement
# `zenoh-py`) when the venv is missing.
#   scripts/zenoh.sh          install (idempotent)
#   scripts/zenoh.sh --zenohd only the Zenoh router, zenohd 1.10.2 (pinned, with its own
#                             Cargo.lock), into target/zenohd/bin, for
#                             crates/shmlink-zenoh/tests/router.rs (it skips without it)
# zenohd is built as the tests use it: a debug build with only the TCP transport, in the
# workspace's target dir (it reuses what the bridge's build shares with it). That took
# 4.6 CPU-minutes here (248 s user + 28 s sys, 117 crates), against 12.5 for the default
# release build (`cargo install zenohd --locked`, every transport and plugin support).
# .ci/run builds it in the background while it installs packages.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --zenohd ]; then
  if [ ! -x target/zenohd/bin/zenohd ]; then
    cargo install zenohd --version 1.10.2 --locked --debug \
      --no-default-features --features zenoh/transport_tcp \
      --root target/zenohd --target-dir target
  fi
  target/zenohd/bin/zenohd --version
  exit 0
fi
venv=target/zenoh-venv
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check 'eclipse-zenoh==1.10.2'
"$venv/bin/python" -c 'import zenoh; print("eclipse-zenoh", zenoh.__version__ if hasattr(zenoh, "__version__") else "installed")'
