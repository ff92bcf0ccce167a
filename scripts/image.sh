#!/usr/bin/env bash
# shmlink's container image, built on this machine without a registry (docs/containers.md).
#
# Usage: scripts/image.sh build [TAG] | rootfs DIR | list [TAG] | redis [TAG]
#   build   release build of the shmlink CLI, libshmlink_preload.so and libshmlink.so
#           as deploy/Dockerfile's build stage makes it (its ENV; in target/dockerfile-check,
#           shared with scripts/check-dockerfile.sh), then `rootfs target/image` and `podman build`
#           of an image FROM scratch holding that tree and tini, with the final stage's
#           ENV, USER, ENTRYPOINT and CMD of deploy/Dockerfile (the recipe for machines
#           with a registry, whose build stage runs the same `rootfs`). TAG defaults to
#           localhost/shmlink:dev. Does nothing when TAG exists and was built from the
#           same files (a content hash of the tree and the recipe, in the image's label
#           org.shmlink.content); prints the image's size and contents either way.
#   rootfs  DIR/root gets the image's tree: /usr/local/bin/shmlink,
#           /usr/local/lib/{libshmlink_preload.so,libshmlink.so*,pkgconfig/shmlink.pc},
#           /usr/local/include/shmlink.h, stripped, with every library `ldd` lists for
#           them at its path (glibc, libgcc_s, the loader), /etc/passwd and /etc/group
#           with user and group shmlink (10001) and /tmp (1777); DIR/run-shmlink is the
#           empty /run/shmlink (mode 0700; the Dockerfile gives it to 10001). No shell, no package manager, no compiler. Reads the release build
#           in ${CARGO_TARGET_DIR:-target}/release.
#   list    the size and files of TAG.
#   redis [TAG]
#           an image for the container tests and benchmarks of transparent mode
#           (docs/containers.md): the shmlink image (build it first) plus this machine's
#           redis-server and redis-benchmark (scripts/apps.sh install) and the libraries
#           `ldd` lists for them. TAG defaults to localhost/shmlink-redis:dev; rebuilt only
#           when its contents changed (the same content label as build).
# Needs podman (scripts/containers.sh install) for build and list; tini-static from
# Debian's tini package for build.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'image.sh: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

# build_if_changed TAG CTX HASH: builds CTX/Containerfile as TAG unless TAG already carries
# the content label HASH.
build_if_changed() {
  local tag=$1 ctx=$2 hash=$3 old
  old=$(podman image inspect --format '{{index .Labels "org.shmlink.content"}}' "$tag" 2>/dev/null || true)
  if [ "$old" = "$hash" ]; then
    log "$tag is up to date (content $hash)"
  else
    podman build -q --label "org.shmlink.content=$hash" -f "$ctx/Containerfile" -t "$tag" "$ctx" >/dev/null
    podman image prune -f >/dev/null 2>&1 || true
    log "built $tag (content $hash)"
  fi
}

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
uid=10001

cmd_rootfs() {
  local out=${1%/} root=${1%/}/root rel=${CARGO_TARGET_DIR:-target}/release
  local shmlink=$rel/shmlink preload=$rel/libshmlink_preload.so capi=$rel/libshmlink_capi.so
  local f
  for f in "$shmlink" "$preload" "$capi"; do
    [ -f "$f" ] || die "rootfs: no $f (cargo build --release -p shmlink-cli -p shmlink-preload -p shmlink-capi)"
  done
  rm -rf "$root" "$out/run-shmlink"
  mkdir -p "$root"/usr/local/bin "$root"/usr/local/lib/pkgconfig "$root"/usr/local/include \
    "$root"/etc "$root"/run "$root"/tmp "$out/run-shmlink"
  # Stripped copies: the release profile keeps debug info for profiling, the image does
  # not need it.
  strip -o "$root/usr/local/bin/shmlink" "$shmlink"
  strip --strip-unneeded -o "$root/usr/local/lib/libshmlink_preload.so" "$preload"
  strip --strip-unneeded -o "$root/usr/local/lib/libshmlink.so.$version" "$capi"
  ln -s "libshmlink.so.$version" "$root/usr/local/lib/libshmlink.so.0"
  ln -s libshmlink.so.0 "$root/usr/local/lib/libshmlink.so"
  cp crates/shmlink-capi/include/shmlink.h "$root/usr/local/include/shmlink.h"
  sed -e "s|@PREFIX@|/usr/local|" -e "s|@VERSION@|$version|" crates/shmlink-capi/shmlink.pc.in >"$root/usr/local/lib/pkgconfig/shmlink.pc"
  # Every library the three need, at the path the loader finds it here (the same glibc
  # the build linked against), symbolic links resolved.
  # (sed, not awk: the build stage's image need not have awk.)
  local lib libs
  libs=$(ldd "$shmlink" "$preload" "$capi" |
    sed -n -e 's#^[[:space:]].* => \(/[^ ]*\) .*#\1#p' -e 's#^[[:space:]]\{1,\}\(/[^ ]*\) .*#\1#p' | sort -u)
  for lib in $libs; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  # The loader is found by its absolute path (PT_INTERP); on merged-/usr systems it sits
  # under /usr/lib64 behind the /lib64 link.
  local interp
  interp=$(echo "$libs" | grep '/ld-linux' | head -1)
  [ -n "$interp" ] && [ -f "$root$interp" ] || die "rootfs: no program loader found in ldd's output"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nshmlink:x:%s:%s:shmlink:/nonexistent:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n' \
    "$uid" "$uid" >"$root/etc/passwd"
  printf 'root:x:0:\nshmlink:x:%s:\nnogroup:x:65534:\n' "$uid" >"$root/etc/group"
  chmod 1777 "$root/tmp"
  # /run/shmlink apart: COPY gives what it copies to root unless told another owner.
  chmod 0700 "$out/run-shmlink"
  log "rootfs in $root: $(du -sh "$root" | cut -f1)"
}

# The Containerfile for the local build: deploy/Dockerfile's final stage (from its last
# FROM), its copies from the other stages made copies from the local context (the build
# stage's /out is target/image, the tini stage's tini-static is ./tini).
containerfile() {
  echo "# Generated by scripts/image.sh from deploy/Dockerfile's final stage."
  sed -e '/^[[:space:]]*#/d' deploy/Dockerfile |
    awk '{ if (sub(/\\[[:space:]]*$/, "")) { buf = buf $0 " " } else { print buf $0; buf = "" } }' |
    awk 'toupper($1) == "FROM" { n++ } { lines[n] = lines[n] $0 "\n" } END { printf "%s", lines[n] }' |
    sed -e 's# --from=build##' -e 's# /out/# #' -e 's# --from=tini /usr/bin/tini-static# tini#' |
    awk 'NF'
}

cmd_build() {
  local tag=${1:-localhost/shmlink:dev}
  command -v podman >/dev/null || die "build: podman is not installed (scripts/containers.sh install)"
  local tini=/usr/bin/tini-static
  [ -x "$tini" ] || die "build: no $tini (Debian's tini package: scripts/containers.sh install)"
  # The build of deploy/Dockerfile's build stage, as scripts/check-dockerfile.sh makes it
  # (its ENV, CXX=false, its target directory): where the check ran (CI runs it first),
  # cargo finds everything built and the image holds the very files the check built.
  local target=$PWD/target/dockerfile-check
  CARGO_TARGET_DIR=$target CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=symbols \
    CXX=false cargo build --release --locked -q -p shmlink-cli -p shmlink-preload -p shmlink-capi
  local ctx=target/image
  mkdir -p "$ctx"
  CARGO_TARGET_DIR=$target cmd_rootfs "$ctx"
  cp "$tini" "$ctx/tini"
  containerfile >"$ctx/Containerfile"
  ! grep -q -- '--from=' "$ctx/Containerfile" ||
    die "build: deploy/Dockerfile's final stage copies from a stage this script does not know: $(grep -- '--from=' "$ctx/Containerfile")"
  # What the image is made of: every file's path, mode, owner and content.
  local hash
  hash=$( (cd "$ctx" && find root run-shmlink tini Containerfile -printf '%p %m %U %l\n' | sort &&
    find root run-shmlink tini Containerfile -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16)
  build_if_changed "$tag" "$ctx" "$hash"
  cmd_list "$tag"
}

cmd_list() {
  local tag=${1:-localhost/shmlink:dev}
  podman image exists "$tag" || die "list: no image $tag (scripts/image.sh build)"
  podman image inspect --format 'image {{index .RepoTags 0}}: {{.Size}} bytes, user {{.Config.User}}, entrypoint {{.Config.Entrypoint}}' "$tag"
  local ctr listing
  ctr=$(podman create "$tag")
  # The tree as tar from the container's file system (the image has no shell to list it);
  # the container is removed whatever happens.
  listing=$(podman export "$ctr" | tar -tvf - || true)
  podman rm -f "$ctr" >/dev/null
  [ -n "$listing" ] || die "list: could not export $tag"
  echo "$listing" | awk '{ printf "  %s %s %9s %s %s %s\n", $1, $2, $3, $6, $7, $8 }' | sort -k6
}

cmd_redis() {
  local tag=${1:-localhost/shmlink-redis:dev} base=localhost/shmlink:dev
  podman image exists "$base" || die "redis: no image $base (scripts/image.sh build)"
  local server bench
  server=$(command -v redis-server) && bench=$(command -v redis-benchmark) ||
    die "redis: no redis-server/redis-benchmark here (scripts/apps.sh install)"
  local ctx=target/image-redis
  rm -rf "$ctx"
  mkdir -p "$ctx/root/usr/bin"
  cp "$server" "$ctx/root/usr/bin/redis-server"
  cp "$bench" "$ctx/root/usr/bin/redis-benchmark"
  local lib
  for lib in $(ldd "$server" "$bench" | sed -n 's#^[[:space:]].* => \(/[^ ]*\) .*#\1#p' | sort -u); do
    mkdir -p "$ctx/root$(dirname "$lib")"
    cp -L "$lib" "$ctx/root$lib"
  done
  printf 'FROM %s\nCOPY root /\n' "$base" >"$ctx/Containerfile"
  local hash
  hash=$( (podman image inspect --format '{{.Id}}' "$base" &&
    cd "$ctx" && find root Containerfile -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16)
  build_if_changed "$tag" "$ctx" "$hash"
  podman image inspect --format 'image {{index .RepoTags 0}}: {{.Size}} bytes' "$tag"
}

case ${1:-} in
  build) cmd_build "${2:-}" ;;
  redis) cmd_redis "${2:-}" ;;
  rootfs)
    [ $# -eq 2 ] || { echo "usage: $0 rootfs DIR" >&2; exit 2; }
    cmd_rootfs "$2"
    ;;
  list) cmd_list "${2:-}" ;;
  *)
    echo "usage: $0 build [TAG] | rootfs DIR | list [TAG] | redis [TAG]" >&2
    exit 2
    ;;
esac
