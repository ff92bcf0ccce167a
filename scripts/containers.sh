#!/usr/bin/env bash
# A container runtime for the container tests and deploy/ (docs/containers.md): rootful
# podman with runc, from Debian's packages, set up for machines like CI's (no systemd as
# PID 1, hybrid cgroup v1/v2 that crun refuses, no CAP_SYS_RESOURCE).
#
# Usage: scripts/containers.sh install|check|validate
#   install  apt-get installs podman, buildah, runc and tini (its static tini-static is
#            the images' PID 1) when missing (root), then writes
#            /etc/containers/containers.conf.d/50-shmlink.conf (idempotent: rewritten
#            each time) with
#              - runtime "runc" (crun, podman's other runtime, refuses hybrid cgroups),
#              - cgroup_manager "cgroupfs" and events_logger "file" when systemd is not
#                PID 1 (podman's defaults talk to systemd and journald),
#              - default ulimits nofile and nproc at or below the current hard limits
#                (`ulimit -Hn`, `-Hu`): podman's defaults raise them, which needs
#                CAP_SYS_RESOURCE that sandboxes often lack; where a container still
#                cannot take a hard limit (some sandboxes cap RLIMIT_NPROC lower than
#                they report), the largest of 32768, 4096, 1024 that works,
#            and checks that a container runs (a throwaway image of busybox, if
#            /bin/busybox is static; else `podman info` only).
#   check    exit 0 when podman runs containers here, 1 (with the reason) when not.
#   validate checks deploy/k8s/*.yaml against the Kubernetes API's JSON schemas, strictly
#            (unknown fields are errors), for Kubernetes 1.29 (native sidecars, the
#            oldest the docs name) and the newest the validator knows: the
#            kubernetes-validate package from PyPI (schemas included, no cluster and no
#            network at run time) in a venv under target/kube-venv. A manifest with a
#            wrong field must fail first, so a validator that checks nothing fails too.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'containers.sh: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

conf_dir=/etc/containers/containers.conf.d
conf=$conf_dir/50-shmlink.conf

# write_conf NOFILE NPROC
write_conf() {
  local hn=$1 hu=$2 engine_extra=
  if [ "$(ps -p 1 -o comm= 2>/dev/null)" != systemd ]; then
    engine_extra=$'cgroup_manager = "cgroupfs"\nevents_logger = "file"'
  fi
  mkdir -p "$conf_dir"
  local tmp
  tmp=$(mktemp "$conf_dir/.50-shmlink.XXXXXX")
  cat >"$tmp" <<CONF
# Written by shmlink's scripts/containers.sh install; rewritten each time it runs.
[containers]
# At (not above) this machine's hard limits: raising them needs CAP_SYS_RESOURCE.
default_ulimits = ["nofile=$hn:$hn", "nproc=$hu:$hu"]

[engine]
# crun refuses hybrid cgroup v1/v2 layouts; runc runs on them.
runtime = "runc"
$engine_extra
CONF
  chmod 644 "$tmp"
  mv "$tmp" "$conf"
  log "wrote $conf (runc, nofile=$hn, nproc=$hu${engine_extra:+, cgroupfs, file events})"
}

# Runs a throwaway container (with podman run options "$@"): 0 when it printed what it
# was told to.
smoke() {
  podman info >/dev/null 2>&1 || { log "podman info failed: $(podman info 2>&1 | tail -1)"; return 1; }
  local busybox=/bin/busybox
  if ! file -L "$busybox" 2>/dev/null | grep -q 'statically linked'; then
    [ -x "$busybox" ] && ldd "$busybox" 2>&1 | grep -q 'not a dynamic' || {
      log "no static busybox to run a container with: podman info works, nothing ran"
      return 0
    }
  fi
  local image=localhost/shmlink-smoke:latest out ctx
  if ! podman image exists "$image"; then
    ctx=$(mktemp -d)
    cp "$busybox" "$ctx/busybox"
    printf 'FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT ["/bin/busybox"]\n' >"$ctx/Containerfile"
    podman build -q -t "$image" "$ctx" >/dev/null || { rm -rf "$ctx"; log "podman build of $image failed"; return 1; }
    rm -rf "$ctx"
  fi
  out=$(timeout 60 podman run --rm --network none "$@" "$image" echo container-ok 2>&1) || {
    log "podman run failed: $out"
    return 1
  }
  [ "$out" = container-ok ] || { log "podman run printed: $out"; return 1; }
}

cmd_install() {
  if ! command -v podman >/dev/null || ! command -v buildah >/dev/null ||
    ! command -v runc >/dev/null || [ ! -x /usr/bin/tini-static ] || ! command -v catatonit >/dev/null; then
    [ "$(id -u)" -eq 0 ] || die "install: needs root (apt-get)"
    command -v apt-get >/dev/null || die "install: needs apt-get (Debian)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      podman buildah runc tini catatonit
  else
    log "podman, buildah, runc and tini are installed"
  fi
  [ "$(id -u)" -eq 0 ] || die "install: needs root (writes $conf)"
  # The limits: the hard ones, else the largest smaller one a container can take.
  local hn hu n u ok=
  hn=$(ulimit -Hn)
  hu=$(ulimit -Hu)
  # "unlimited" is not a number podman takes; a million is more than any test needs.
  [ "$hn" = unlimited ] && hn=1048576
  [ "$hu" = unlimited ] && hu=1048576
  # Probed first (the smoke containers take the limits on their command line), written
  # once: a conf with limits no container takes never stands, not even while probing.
  for n in "$hn" 1024; do
    for u in "$hu" 32768 4096 1024; do
      [ "$u" -le "$hu" ] && [ "$n" -le "$hn" ] || continue
      if smoke --ulimit "nofile=$n:$n" --ulimit "nproc=$u:$u" 2>/dev/null; then
        ok=1
        break 2
      fi
    done
  done
  [ -n "$ok" ] || die "install: no container runs with ulimits at or below nofile=$hn nproc=$hu: $(smoke --ulimit "nofile=1024:1024" --ulimit "nproc=1024:1024" 2>&1 | tail -1)"
  write_conf "$n" "$u"
  smoke || die "install: podman does not run containers here (above)"
  log "podman $(podman version --format '{{.Client.Version}}') runs containers with $(podman info --format '{{.Host.OCIRuntime.Name}}')"
}

cmd_validate() {
  local venv=target/kube-venv kv=1.37.0
  if [ ! -x "$venv/bin/kubernetes-validate" ] || [ "$("$venv/bin/kubernetes-validate" --version 2>/dev/null)" != "$kv" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "kubernetes-validate==$kv"
  fi
  local v="$venv/bin/kubernetes-validate" bad
  bad=$(mktemp --suffix=.yaml)
  trap 'rm -f "$bad"' RETURN
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n    - name: a\n      image: i\n      livenessProbe: {exec: {command: "not a list"}}\n' >"$bad"
  if "$v" --strict "$bad" >/dev/null 2>&1; then
    die "validate: kubernetes-validate accepted a Pod whose probe command is not a list"
  fi
  local k
  for k in 1.29.0 "$kv"; do
    "$v" --strict -k "$k" deploy/k8s/*.yaml || die "validate: deploy/k8s does not validate for Kubernetes $k"
  done
}

case ${1:-} in
  install) cmd_install ;;
  validate) cmd_validate ;;
  check)
    command -v podman >/dev/null || die "podman is not installed (scripts/containers.sh install)"
    smoke
    ;;
  *)
    echo "usage: $0 install|check|validate" >&2
    exit 2
    ;;
esac
