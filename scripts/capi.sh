#!/usr/bin/env bash
# shmlink's C library: build, install, regenerate the header.
#
#   scripts/capi.sh install PREFIX [--debug]   build (release unless --debug) and install
#       PREFIX/lib/libshmlink.so{,.0,.0.1.0}, PREFIX/lib/libshmlink.a,
#       PREFIX/include/shmlink.h and PREFIX/lib/pkgconfig/shmlink.pc
#   scripts/capi.sh header                     rewrite crates/shmlink-capi/include/shmlink.h
#       from the source (cbindgen as a library, in the crate's header test)
#   scripts/capi.sh test                       the C tests (C11, ASan+UBSan, against an
#       installed copy under target/capi): cargo test -p shmlink-capi --test c
#   scripts/capi.sh example NAME               build crates/shmlink-capi/examples/NAME.c
#       (echo_server, echo_client, poll_server, pubsub) against a debug install in
#       target/capi/prefix; prints the program's path (for other languages' tests)
#
# The C tests run from `cargo test` (crates/shmlink-capi/tests/c.rs calls `install`), so
# scripts/test.sh's workspace test step runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

install() {
  local prefix=$1 profile=release dir=release
  [[ ${2:-} == --debug ]] && { profile=dev; dir=debug; }
  cargo build -q -p shmlink-capi --profile "$profile"
  local target=${CARGO_TARGET_DIR:-target}/$dir
  mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
  prefix=$(cd "$prefix" && pwd)
  # Replace, never write through: a running program may map the old file.
  rm -f "$prefix/lib/libshmlink.so.$version" "$prefix/lib/libshmlink.a"
  cp "$target/libshmlink_capi.so" "$prefix/lib/libshmlink.so.$version"
  ln -sf "libshmlink.so.$version" "$prefix/lib/libshmlink.so.0"
  ln -sf "libshmlink.so.0" "$prefix/lib/libshmlink.so"
  cp "$target/libshmlink_capi.a" "$prefix/lib/libshmlink.a"
  cp crates/shmlink-capi/include/shmlink.h "$prefix/include/shmlink.h"
  sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" crates/shmlink-capi/shmlink.pc.in >"$prefix/lib/pkgconfig/shmlink.pc"
  echo "installed libshmlink $version ($profile) to $prefix"
}

case ${1:-} in
  install) [[ $# -ge 2 ]] || { echo "usage: $0 install PREFIX [--debug]" >&2; exit 2; }
    install "$2" "${3:-}" ;;
  header) SHMLINK_WRITE_HEADER=1 cargo test -q -p shmlink-capi --test header ;;
  test) cargo test -p shmlink-capi --test c ;;
  example) [[ $# -eq 2 ]] || { echo "usage: $0 example NAME" >&2; exit 2; }
    src=crates/shmlink-capi/examples/$2.c
    [[ -f $src ]] || { echo "no example $src" >&2; exit 2; }
    install target/capi/prefix --debug >&2
    export PKG_CONFIG_PATH=$PWD/target/capi/prefix/lib/pkgconfig
    mkdir -p target/capi/examples
    # shellcheck disable=SC2046
    cc -std=c11 -Wall -Wextra -Werror -O1 -g "$src" -o "target/capi/examples/$2" \
      $(pkg-config --cflags --libs shmlink) -Wl,-rpath,"$(pkg-config --variable=libdir shmlink)"
    echo "$PWD/target/capi/examples/$2" ;;
  *) sed -n '2,16p' "$0" >&2; exit 2 ;;
esac
