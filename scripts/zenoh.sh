#!/usr/bin/env bash
# What the Zenoh bridge's interop tests (crates/shmlink-zenoh/tests/interop.rs) need:
# the official Python client, eclipse-zenoh from PyPI (pinned to the Rust crate's minor
# version), in a venv under target/. .ci/run calls it; the tests skip (requirement
# `zenoh-py`) when the venv is missing.
#   scripts/zenoh.sh          install (idempotent)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/zenoh-venv
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check 'eclipse-zenoh==1.10.2'
"$venv/bin/python" -c 'import zenoh; print("eclipse-zenoh", zenoh.__version__ if hasattr(zenoh, "__version__") else "installed")'
