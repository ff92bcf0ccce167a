#!/usr/bin/env bash
# The Python package as users install it without Rust: an abi3 manylinux wheel and an
# sdist, built with maturin (`--release --strip`, linked by zig against glibc 2.28's
# symbols so the wheel is manylinux_2_28: Debian 10+, RHEL 8+, Ubuntu 18.10+), checked
# with `auditwheel show`, then installed into a clean virtualenv whose PATH has no cargo
# or rustc, where the package's pytest suite runs.
#   scripts/wheel.sh            build + check + test; the wheel and sdist in target/wheels
#   scripts/wheel.sh --no-test  build + check only
#   PYTHON=python3.12 scripts/wheel.sh   another interpreter for the test (CPython >= 3.11)
# The tools (maturin, auditwheel, ziglang) come from PyPI into target/wheel-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
tools=target/wheel-tools
out=target/wheels
policy=manylinux_2_28
[ -x "$tools/bin/python" ] || "$python" -m venv "$tools"
"$tools/bin/python" -m pip install -q --disable-pip-version-check \
  'maturin>=1.5,<2' 'auditwheel>=6' 'ziglang>=0.11'
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)
# The zig linker's target dir is its own (target/x86_64-unknown-linux-gnu/...).
PATH="$PWD/$tools/bin:$PATH" "$tools/bin/maturin" build --release --strip --zig \
  --compatibility "$policy" -m crates/shmlink-py/Cargo.toml -o "$out"
PATH="$PWD/$tools/bin:$PATH" "$tools/bin/maturin" sdist -m crates/shmlink-py/Cargo.toml -o "$out"
echo "wheel.sh: built in $(($(date +%s) - start)) s"
wheel=$(ls "$out"/*.whl)
sdist=$(ls "$out"/*.tar.gz)
ls -l "$wheel" "$sdist"
report=$("$tools/bin/auditwheel" show "$wheel")
echo "$report"
grep -q "constrains the platform tag to \"${policy}_x86_64\"" <<<"$report" ||
  { echo "wheel.sh: $wheel is not $policy"; exit 1; }
case $wheel in *-cp311-abi3-*"$policy"*) ;; *) echo "wheel.sh: unexpected tags: $wheel"; exit 1 ;; esac
[ "${1:-}" = --no-test ] && exit 0

# A clean virtualenv, and a PATH with no Rust toolchain on it.
venv=target/wheel-venv
rm -rf "$venv"
"$python" -m venv "$venv"
clean_path=$PWD/$venv/bin:/usr/local/bin:/usr/bin:/bin
for tool in cargo rustc; do
  if PATH=$clean_path command -v "$tool" >/dev/null; then
    echo "wheel.sh: $tool is on the clean PATH ($(PATH=$clean_path command -v "$tool")); move it away to test" >&2
    exit 1
  fi
done
# The C echo server for the Python-client-to-C-server test, built before PATH is cleaned.
if [ -z "${SHMLINK_C_ECHO_SERVER:-}" ] && command -v cc >/dev/null && command -v pkg-config >/dev/null; then
  SHMLINK_C_ECHO_SERVER=$(scripts/capi.sh example echo_server)
  export SHMLINK_C_ECHO_SERVER
fi
PATH=$clean_path "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  'pytest>=7' 'pytest-timeout>=2' 'cryptography>=41'
t0=$(date +%s%N)
PATH=$clean_path "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index "$wheel"
echo "wheel.sh: pip install of the wheel took $((($(date +%s%N) - t0) / 1000000)) ms"
cd crates/shmlink-py
# From the venv's installed package, not from the source tree's python/.
PATH=$clean_path exec "../../$venv/bin/python" -m pytest -ra -p no:cacheprovider
