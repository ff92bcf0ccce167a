#!/usr/bin/env bash
# Installs the system packages that the optional cargo features need; safe to run again.
#
#   zmq (the zmq-ipc and zmq-tcp bench methods): libzmq and its headers, found through
#   pkg-config (Debian: libzmq3-dev, pkg-config).
#
# Does nothing when everything is already there. Needs apt (Debian, Ubuntu); uses sudo
# only when not run as root.
set -euo pipefail

if command -v pkg-config >/dev/null && pkg-config --exists libzmq; then
  echo "install-deps: libzmq $(pkg-config --modversion libzmq) is installed; nothing to do"
  exit 0
fi

if ! command -v apt-get >/dev/null; then
  echo "install-deps: apt-get not found; install libzmq (>= 4.1) with its headers and" \
    "pkg-config by hand (the packages are libzmq3-dev and pkg-config on Debian)" >&2
  exit 1
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: not root and sudo not found; run this script as root" >&2
    exit 1
  fi
  sudo=sudo
fi

echo "install-deps: installing libzmq3-dev and pkg-config with apt-get"
$sudo apt-get update -q
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  libzmq3-dev pkg-config

if ! pkg-config --exists libzmq; then
  echo "install-deps: libzmq3-dev is installed but pkg-config does not find libzmq" >&2
  exit 1
fi
echo "install-deps: libzmq $(pkg-config --modversion libzmq) installed"
