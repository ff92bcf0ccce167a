#!/usr/bin/env bash
# The Python package (crates/shmlink-py): makes a venv under target/, installs maturin,
# pytest and the package exactly as the README says (pip install ./crates/shmlink-py),
# and runs the pytest suite (cryptography makes the tls: test certificates).
# scripts/test.sh runs the same suite through scripts/wheel.sh instead (one build of
# the extension). Skipped tests go to $SHMLINK_SKIP_LOG.
#   scripts/python.sh            install + test
#   scripts/python.sh --no-test  install only (scripts/bench-python.py uses the venv)
#   PYTHON=python3.12 scripts/python.sh   another interpreter (CPython >= 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-venv
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# The venv's programs first: maturin's build hook runs the `maturin` it installed.
export PATH="$PWD/$venv/bin:$PATH"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  'maturin>=1.5,<2' 'pytest>=7' 'pytest-timeout>=2' 'cryptography>=41'
# --force-reinstall: the version number does not change with the code.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall \
  --no-build-isolation \
  ./crates/shmlink-py
[ "${1:-}" = --no-test ] && exit 0
# The C echo server for the Python-client-to-C-server test (a skip without a C compiler
# and pkg-config; SHMLINK_REQUIRE=cc,capi makes that a failure).
if [ -z "${SHMLINK_C_ECHO_SERVER:-}" ] && command -v cc >/dev/null && command -v pkg-config >/dev/null; then
  SHMLINK_C_ECHO_SERVER=$(scripts/capi.sh example echo_server)
  export SHMLINK_C_ECHO_SERVER
fi
cd crates/shmlink-py
# Not from the source tree's python/ (that has no compiled module): from the venv.
exec "../../$venv/bin/python" -m pytest -ra -p no:cacheprovider
