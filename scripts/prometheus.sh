#!/usr/bin/env bash
# The Prometheus server that scrapes `shmlink metrics` in its test
# (crates/shmlink-cli/tests/metrics.rs): Debian's `prometheus` package. The test starts
# its own instance on loopback with a temporary configuration and storage; nothing here
# runs it, and the package's system service is kept from starting while it installs.
#
# Usage: scripts/prometheus.sh install|version
#   install  apt-get installs prometheus (root; Debian 12 ships 2.42) unless
#            `prometheus` is already on PATH.
#   version  prints `prometheus --version`'s first line; status 1 when it is missing.
set -euo pipefail

log() { printf 'prometheus.sh: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

cmd_install() {
  if command -v prometheus >/dev/null; then
    log "installed: $(prometheus --version 2>&1 | head -n1)"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || die "install: needs root (apt-get)"
  command -v apt-get >/dev/null || die "install: needs apt-get (Debian 12)"
  # No service starts during the installation (policy-rc.d answers 101, "not allowed");
  # an existing policy-rc.d is left as it is.
  local policy=/usr/sbin/policy-rc.d made_policy=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# scripts/prometheus.sh install: no service starts\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    made_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  log "apt-get update"
  apt-get update -qq
  log "apt-get install prometheus"
  apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    prometheus >/dev/null
  if [ -n "$made_policy" ]; then
    rm -f "$policy"
    trap - EXIT
  fi
  command -v prometheus >/dev/null || die "install: no prometheus on PATH after apt-get"
  log "installed: $(prometheus --version 2>&1 | head -n1)"
}

case "${1:-}" in
install) cmd_install ;;
version)
  command -v prometheus >/dev/null || die "not installed (scripts/prometheus.sh install)"
  prometheus --version 2>&1 | head -n1
  ;;
*) die "usage: scripts/prometheus.sh install|version" ;;
esac
