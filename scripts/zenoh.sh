#!/usr/bin/env bash
# What the Zenoh bridge's interop tests (crates/shmlink-zenoh/tests/interop.rs) need:
# the official Python client, eclipse-zenoh from PyPI (pinned to the Rust crate's minor
# version), in a venv under target/. .ci/run calls it; the tests skip (requirement
# `zenoh-py`) when the venv is missing.
#   scripts/zenoh.sh          install (idempotent)
#   scripts/zenoh.sh --zenohd also the Zenoh router, zenohd 1.10.2, into target/zenohd
#                             (cargo install --locked: a long release build, not run by
#                             CI; crates/shmlink-zenoh/tests/router.rs skips without it)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --zenohd ] && [ ! -x target/zenohd/bin/zenohd ]; then
  cargo install zenohd --version 1.10.2 --locked --root target/zenohd --target-dir target/zenohd/build
fi
venv=target/zenoh-venv
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check 'eclipse-zenoh==1.10.2'
"$venv/bin/python" -c 'import zenoh; print("eclipse-zenoh", zenoh.__version__ if hasattr(zenoh, "__version__") else "installed")'
