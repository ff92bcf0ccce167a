#!/usr/bin/env bash
# Debian packages of shmlink, made with dpkg-deb from scripts/install.sh's tree (prefix
# /usr; no other packaging tool):
#   shmlink_VERSION_ARCH.deb       the command, the C library (.so, .a, header, pkg-config
#                                  file), the preload library, manual pages, completions
#   shmlink-dbg_VERSION_ARCH.deb   the debug info split off the binaries (/usr/lib/debug)
#
#   scripts/deb.sh build [OUTDIR]   build both into OUTDIR (default target/deb); prints paths
#   scripts/deb.sh test             build, `dpkg -i`, scripts/install-check.sh /usr against
#                                   the system copy, `dpkg -r`, and check nothing is left;
#                                   needs root and dpkg, and refuses to touch a shmlink
#                                   package installed before it (a skip, see below)
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

build() {
  local out=${1:-target/deb} arch stage
  arch=$(dpkg --print-architecture)
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  stage=$out/stage
  rm -rf "$stage"
  DESTDIR=$stage/shmlink scripts/install.sh /usr >&2
  # The debug info goes to its own package.
  mkdir -p "$stage/shmlink-dbg/usr/lib"
  mv "$stage/shmlink/usr/lib/debug" "$stage/shmlink-dbg/usr/lib/debug"
  # Debian's place for the licence.
  cat >"$stage/shmlink/usr/share/doc/shmlink/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: shmlink
License: MIT or Apache-2.0 (see LICENSE-MIT and LICENSE-APACHE in this directory)
EOF
  mkdir -p "$stage/shmlink-dbg/usr/share/doc"
  ln -s shmlink "$stage/shmlink-dbg/usr/share/doc/shmlink-dbg"
  # The C library's lowest glibc symbol version a program needs.
  local glibc
  glibc=$(objdump -T "$stage"/shmlink/usr/bin/shmlink "$stage"/shmlink/usr/lib/libshmlink.so.* \
    "$stage"/shmlink/usr/lib/shmlink/libshmlink_preload.so |
    sed -n 's/.*GLIBC_\([0-9.]*\).*/\1/p' | sort -V | tail -1)
  for pkg in shmlink shmlink-dbg; do
    local dir=$stage/$pkg size
    mkdir -p "$dir/DEBIAN"
    size=$(du -sk --exclude=DEBIAN "$dir" | cut -f1)
    {
      echo "Package: $pkg"
      echo "Version: $version"
      echo "Architecture: $arch"
      echo "Maintainer: shmlink developers <shmlink@invalid>"
      echo "Installed-Size: $size"
      echo "Section: net"
      echo "Priority: optional"
      if [[ $pkg == shmlink ]]; then
        echo "Depends: libc6 (>= $glibc), libgcc-s1"
        echo "Description: fast, reliable messaging between processes on one Linux kernel"
        echo " shmlink moves messages between processes over shared memory, Unix sockets,"
        echo " TCP and TLS behind one API. This package holds the shmlink command, the C"
        echo " library (libshmlink.so.0, libshmlink.a, shmlink.h, pkg-config file) and"
        echo " libshmlink_preload.so, which moves unmodified TCP programs to shared memory"
        echo " (shmlink run)."
      else
        echo "Depends: shmlink (= $version)"
        echo "Description: debug info for shmlink"
        echo " The debug info split off shmlink's binaries and libraries, under"
        echo " /usr/lib/debug/.build-id, where gdb finds it."
      fi
    } >"$dir/DEBIAN/control"
    if [[ $pkg == shmlink ]]; then
      # The new library in ld.so's cache at once.
      echo "activate-noawait ldconfig" >"$dir/DEBIAN/triggers"
    fi
    (cd "$dir" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
      xargs -0 md5sum >DEBIAN/md5sums)
    find "$dir" -type d -exec chmod 0755 {} +
    dpkg-deb --root-owner-group -Zgzip --build "$dir" "$out/${pkg}_${version}_$arch.deb" >&2
    echo "$out/${pkg}_${version}_$arch.deb"
  done
}

# skip CATEGORY REASON: as shmlink_testkit::skip (a line in $SHMLINK_SKIP_LOG; a failure
# when SHMLINK_REQUIRE names the category or `all`).
skip() {
  local line="SKIPPED scripts/deb.sh::test: $2 [$1]"
  case ",${SHMLINK_REQUIRE:-}," in
    *,"$1",* | *,all,*) echo "$line, but SHMLINK_REQUIRE=$SHMLINK_REQUIRE" >&2; exit 1 ;;
  esac
  echo "$line"
  [[ -z ${SHMLINK_SKIP_LOG:-} ]] || echo "$line" >>"$SHMLINK_SKIP_LOG"
  exit 0
}

test_packages() {
  [[ $(id -u) == 0 ]] || skip root "needs root to install packages"
  command -v dpkg >/dev/null || skip install "needs dpkg (a Debian system)"
  if dpkg-query -W -f='${Status}' shmlink shmlink-dbg 2>/dev/null | grep -q installed; then
    skip install "a shmlink package is installed already; not touching it"
  fi
  local debs
  mapfile -t debs < <(build target/deb)
  ls -l "${debs[@]}"
  dpkg-deb --info "${debs[0]}" | sed -n '/Package:/,$p'
  # Whatever happens below, the system is left as found.
  trap 'dpkg -r shmlink-dbg shmlink >/dev/null 2>&1 || true' EXIT
  dpkg -i "${debs[@]}"
  env -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH -u SHMLINK_PRELOAD_LIB \
    scripts/install-check.sh /usr
  command -v shmlink | grep -qx /usr/bin/shmlink || echo "note: shmlink on PATH is $(command -v shmlink)"
  local files
  files=$(dpkg -L shmlink shmlink-dbg | sort -u)
  dpkg -r shmlink-dbg shmlink
  trap - EXIT
  local left=0
  while read -r f; do
    [[ -f $f || -L $f ]] && { echo "left after dpkg -r: $f"; left=1; }
  done <<<"$files"
  [[ $left == 0 ]] || exit 1
  pkg-config --exists shmlink && { echo "shmlink.pc still found after dpkg -r"; exit 1; }
  echo "deb: installed, checked and removed cleanly ($(wc -l <<<"$files") paths)"
}

case ${1:-} in
  build) build "${2:-}" ;;
  test) test_packages ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
