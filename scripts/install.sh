#!/usr/bin/env bash
# Installs shmlink (release build) under PREFIX, in the usual places:
#   PREFIX/bin/shmlink                          the operator's command
#   PREFIX/bin/shmlink-bench                    the benchmark, with --bench (Rust >= 1.89)
#   PREFIX/lib/libshmlink.so.X.Y.Z              the C library (soname libshmlink.so.0),
#   PREFIX/lib/libshmlink.so.0, libshmlink.so     and its links
#   PREFIX/lib/libshmlink.a                     the static C library (debug info removed)
#   PREFIX/lib/shmlink/libshmlink_preload.so    transparent mode's library (`shmlink run`)
#   PREFIX/lib/pkgconfig/shmlink.pc             with the real prefix
#   PREFIX/include/shmlink.h
#   PREFIX/share/man/man1/shmlink.1, shmlink-COMMAND.1
#   PREFIX/share/man/man3/shmlink.3, shmlink_FUNCTION.3   the C API (needs python3)
#   PREFIX/share/bash-completion/completions/shmlink, share/zsh/site-functions/_shmlink,
#   PREFIX/share/fish/vendor_completions.d/shmlink.fish
#   PREFIX/share/doc/shmlink/                   README, licences, the C and Python guides
#   PREFIX/lib/debug/.build-id/NN/REST.debug    the debug info split off the stripped
#                                               binaries (gdb finds it there when PREFIX is
#                                               /usr; else `set debug-file-directory
#                                               PREFIX/lib/debug`)
#
#   scripts/install.sh [--bench] [--no-debug-info] PREFIX
#     --bench          also build and install shmlink-bench (minutes more)
#     --no-debug-info  strip without keeping the debug info
#   DESTDIR=DIR scripts/install.sh /usr    stage into DIR/usr, files naming /usr (scripts/deb.sh)
#   CARGO_TARGET_DIR is honoured. Needs cargo, objcopy and strip (binutils).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '2,29p' "$0" >&2; exit 2; }
bench= debug_info=1 prefix=
for arg in "$@"; do
  case $arg in
    --bench) bench=1 ;;
    --no-debug-info) debug_info= ;;
    -h|--help) usage ;;
    -*) echo "install.sh: unknown option $arg" >&2; usage ;;
    *) [[ -z $prefix ]] || usage; prefix=$arg ;;
  esac
done
[[ -n $prefix ]] || usage
for tool in objcopy strip; do
  command -v "$tool" >/dev/null || { echo "install.sh: needs $tool (Debian: apt-get install binutils)" >&2; exit 1; }
done
if [[ -n ${DESTDIR:-} ]]; then
  [[ $prefix == /* ]] || { echo "install.sh: with DESTDIR, PREFIX must be absolute" >&2; exit 2; }
else
  mkdir -p "$prefix"
  prefix=$(cd "$prefix" && pwd)
fi
root=${DESTDIR:-}$prefix
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

# One package a build: each gets the features it asks for (built together, the preload's
# `tracing` would change the library under the others), and each reuses what other
# release builds of it left (CI's pong run builds the command).
for package in shmlink-cli shmlink-capi shmlink-preload ${bench:+shmlink-bench}; do
  cargo build --release -p "$package"
done
target=${CARGO_TARGET_DIR:-target}/release

mkdir -p "$root/bin" "$root/lib/shmlink" "$root/lib/pkgconfig" "$root/include" \
  "$root/share/man/man1" "$root/share/doc/shmlink" "$root/share/bash-completion/completions" \
  "$root/share/zsh/site-functions" "$root/share/fish/vendor_completions.d"

# put SRC DEST MODE: copies SRC to DEST (replacing, never writing through a file a running
# program may map), strips it and keeps its debug info under lib/debug.
put() {
  local src=$1 dest=$2 mode=$3 tmp
  tmp=$(mktemp "$dest.XXXXXX")
  cp "$src" "$tmp"
  if [[ -n $debug_info ]]; then
    local id dbg
    id=$(readelf -n "$tmp" 2>/dev/null | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p' | head -1)
    if [[ -n $id ]]; then
      dbg=$root/lib/debug/.build-id/${id:0:2}/${id:2}.debug
    else
      dbg=$root/lib/debug/$(basename "$dest").debug
    fi
    mkdir -p "$(dirname "$dbg")"
    objcopy --only-keep-debug --compress-debug-sections "$tmp" "$dbg"
    chmod 0644 "$dbg"
    strip --strip-unneeded "$tmp"
    objcopy --add-gnu-debuglink="$dbg" "$tmp"
  else
    strip --strip-unneeded "$tmp"
  fi
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$dest"
}

put "$target/shmlink" "$root/bin/shmlink" 0755
[[ -n $bench ]] && put "$target/shmlink-bench" "$root/bin/shmlink-bench" 0755
put "$target/libshmlink_capi.so" "$root/lib/libshmlink.so.$version" 0644
ln -sfn "libshmlink.so.$version" "$root/lib/libshmlink.so.0"
ln -sfn "libshmlink.so.0" "$root/lib/libshmlink.so"
put "$target/libshmlink_preload.so" "$root/lib/shmlink/libshmlink_preload.so" 0644
# The static library: debug sections and the LLVM bitcode rustc embeds for its own LTO
# (.llvmbc, .llvmcmd: most of the rest, and no C linker reads them) off; the symbols
# stay for linking.
tmp=$(mktemp "$root/lib/libshmlink.a.XXXXXX")
cp "$target/libshmlink_capi.a" "$tmp"
strip --strip-debug -R .llvmbc -R .llvmcmd "$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$root/lib/libshmlink.a"
install -m 0644 crates/shmlink-capi/include/shmlink.h "$root/include/shmlink.h"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" crates/shmlink-capi/shmlink.pc.in >"$root/lib/pkgconfig/shmlink.pc"
chmod 0644 "$root/lib/pkgconfig/shmlink.pc"

# Manual pages and completions, generated by the command from its own parser.
shmlink=$target/shmlink
"$shmlink" man >"$root/share/man/man1/shmlink.1"
commands=$("$shmlink" --help | sed -n '/^Commands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }' | grep -vx help)
for c in $commands; do
  "$shmlink" man "$c" >"$root/share/man/man1/shmlink-$c.1"
done
gzip -9nf "$root"/share/man/man1/shmlink*.1
# The C API's pages (man 3 shmlink_connect), from the header's comments.
if command -v python3 >/dev/null; then
  rm -rf "$root/share/man/man3"
  python3 scripts/man3.py crates/shmlink-capi/include/shmlink.h "$root/share/man/man3" "$version"
  gzip -9nf "$root"/share/man/man3/shmlink*.3
  chmod -R u=rwX,go=rX "$root/share/man/man3"
else
  echo "install.sh: no python3, so no man3 pages for the C API (scripts/man3.py)" >&2
fi
"$shmlink" completions bash >"$root/share/bash-completion/completions/shmlink"
"$shmlink" completions zsh >"$root/share/zsh/site-functions/_shmlink"
"$shmlink" completions fish >"$root/share/fish/vendor_completions.d/shmlink.fish"
install -m 0644 README.md LICENSE-MIT LICENSE-APACHE docs/c.md docs/python.md \
  docs/transparent.md "$root/share/doc/shmlink/"
chmod -R u=rwX,go=rX "$root/share/man/man1" "$root/share/bash-completion" \
  "$root/share/zsh" "$root/share/fish"

echo "installed shmlink $version to $root${DESTDIR:+ (for $prefix)}"
