#!/usr/bin/env bash
# Checks an installed shmlink (scripts/install.sh PREFIX, or the Debian package: PREFIX
# /usr) as a user meets it, from outside the source tree:
#   - a C program built with `pkg-config --cflags --libs shmlink` against the installed
#     library (its header's SHMLINK_VERSION_* equal to shmlink_version()), an echo pair
#     over shm:, and the same statically linked (`pkg-config --static`);
#   - the library's soname (libshmlink.so.0), stripped, with its debug info kept apart;
#   - `shmlink run --print-path` names PREFIX/lib/shmlink/libshmlink_preload.so, and
#     `shmlink run` runs a real TCP program pair (python3's socket module) whose connection
#     goes over shared memory (the preload's "fd N on shared memory" log line);
#   - `man shmlink` and `man 3 shmlink_connect` render, the completions are there.
#   scripts/install-check.sh PREFIX     prints "install-check: N checks passed" or fails
# Needs cc, pkg-config, readelf and python3; run by crates/shmlink-cli/tests/install.rs
# and scripts/deb.sh test.
set -euo pipefail
[[ $# -eq 1 ]] || { sed -n '2,14p' "$0" >&2; exit 2; }
src=$(cd "$(dirname "$0")/.." && pwd)
prefix=$1
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
n=0
ok() { n=$((n + 1)); echo "ok $n - $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
cd "$work"

# 1. C against the installed copy, found by pkg-config (the system's own search path for
# /usr; PKG_CONFIG_PATH for another prefix).
if [[ $prefix != /usr ]]; then
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
fi
[[ $(pkg-config --variable=prefix shmlink) == "$prefix" ]] ||
  fail "shmlink.pc names prefix $(pkg-config --variable=prefix shmlink), not $prefix"
cat >version.c <<'C'
#include <stdio.h>
#include <string.h>
#include <shmlink.h>
int main(void) {
  char built[32];
  snprintf(built, sizeof built, "%d.%d.%d", SHMLINK_VERSION_MAJOR, SHMLINK_VERSION_MINOR,
           SHMLINK_VERSION_PATCH);
  printf("header %s, library %s\n", built, shmlink_version());
  return strcmp(built, shmlink_version()) != 0;
}
C
rpath=()
[[ $prefix != /usr ]] && rpath=(-Wl,-rpath,"$(pkg-config --variable=libdir shmlink)")
build() { # build NAME SRC [--static]
  local name=$1 file=$2
  if [[ ${3:-} == --static ]]; then
    # shellcheck disable=SC2046
    cc -std=c11 -Wall -Wextra -Werror -O1 "$file" -o "$name" $(pkg-config --cflags shmlink) \
      "$(pkg-config --variable=libdir shmlink)/libshmlink.a" $(pkg-config --static --libs-only-l shmlink | sed 's/-lshmlink//')
  else
    # shellcheck disable=SC2046
    cc -std=c11 -Wall -Wextra -Werror -O1 "$file" -o "$name" $(pkg-config --cflags --libs shmlink) "${rpath[@]}"
  fi
}
build version version.c
./version >/dev/null || fail "header and library versions differ"
ok "C program built with pkg-config; $(./version)"
loaded=$(ldd ./version | sed -n 's/.*libshmlink\.so\.0 => \(.*\) (0x.*/\1/p')
# -ef: the same file (with merged /usr, /lib/libshmlink.so.0 is /usr/lib's).
[[ -n $loaded && $loaded -ef $(pkg-config --variable=libdir shmlink)/libshmlink.so.0 ]] ||
  fail "the program does not load the installed libshmlink.so.0: $(ldd ./version)"
ok "the program loads $(pkg-config --variable=libdir shmlink)/libshmlink.so.0"

export SHMLINK_DIR=$work/rdv
mkdir -p "$SHMLINK_DIR"
echo_pair() { # echo_pair SUFFIX: the examples' echo server and client over shm:
  local s=$1
  build "echo_server$s" "$src/crates/shmlink-capi/examples/echo_server.c" ${s:+--static}
  build "echo_client$s" "$src/crates/shmlink-capi/examples/echo_client.c" ${s:+--static}
  timeout 20 "./echo_server$s" "shm:install-check$s" >"server$s.out" &
  local server=$!
  pids+=("$server")
  for _ in $(seq 100); do [[ -s server$s.out ]] && break; sleep 0.1; done
  timeout 20 "./echo_client$s" "shm:install-check$s" hello installed >"client$s.out" ||
    fail "echo_client$s: $(cat "client$s.out")"
  wait "$server" || fail "echo_server$s failed"
  grep -q "connected over shm" "client$s.out" && grep -q installed "client$s.out" ||
    fail "echo$s: unexpected output: $(cat "client$s.out")"
}
echo_pair ""
ok "echo server and client (shared library) over shm:"
echo_pair -static
ok "echo server and client (libshmlink.a, pkg-config --static) over shm:"

# 2. The shared library as installed.
libdir=$(pkg-config --variable=libdir shmlink)
soname=$(readelf -d "$libdir/libshmlink.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[[ $soname == libshmlink.so.0 ]] || fail "soname is '$soname'"
readelf -S "$libdir/libshmlink.so" | grep -q '\.debug_info' && fail "libshmlink.so is not stripped"
readelf -S "$libdir/libshmlink.so" | grep -q '\.gnu_debuglink' || fail "libshmlink.so has no debug link"
ok "libshmlink.so: soname $soname, stripped, debug link $(readelf -p .gnu_debuglink "$libdir/libshmlink.so" | sed -n 's/.*\] *\([^ ]*\.debug\).*/\1/p' | head -1)"

# 3. The installed command and its preload library.
shmlink=$prefix/bin/shmlink
want=$prefix/lib/shmlink/libshmlink_preload.so
got=$(env -u SHMLINK_PRELOAD_LIB "$shmlink" run --print-path)
[[ $got -ef $want ]] || fail "shmlink run --print-path: $got, not $want"
ok "shmlink run --print-path: $got"
env -u SHMLINK_PRELOAD_LIB "$shmlink" run -- true || fail "shmlink run -- true"
ok "shmlink run -- true"
cat >echo.py <<'PY'
import socket, sys
if sys.argv[1] == "server":
    s = socket.socket()
    s.bind(("127.0.0.1", 0)); s.listen()
    open(sys.argv[2] + ".tmp", "w").write(str(s.getsockname()[1]))
    __import__("os").rename(sys.argv[2] + ".tmp", sys.argv[2])
    c, _ = s.accept()
    while data := c.recv(4096):
        c.sendall(data)
else:
    c = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
    c.sendall(b"over the installed preload")
    print(c.recv(4096).decode())
PY
env -u SHMLINK_PRELOAD_LIB timeout 20 "$shmlink" run --debug -- python3 echo.py server port \
  >py-server.out 2>py-server.err &
server=$!
pids+=("$server")
for _ in $(seq 100); do [[ -s port ]] && break; sleep 0.1; done
[[ -s port ]] || fail "the python server under shmlink run wrote no port: $(cat py-server.err)"
env -u SHMLINK_PRELOAD_LIB timeout 20 "$shmlink" run --debug -- python3 echo.py client "$(cat port)" \
  >py-client.out 2>py-client.err || fail "python client under shmlink run: $(cat py-client.err)"
wait "$server" || fail "python server under shmlink run: $(cat py-server.err)"
grep -q "over the installed preload" py-client.out || fail "python echo: $(cat py-client.out)"
grep -q "on shared memory" py-client.err && grep -q "on shared memory" py-server.err ||
  fail "the python pair did not move to shared memory: $(cat py-client.err py-server.err)"
ok "python3 TCP echo pair under the installed shmlink run: on shared memory both sides"

# 4. Manual and completions.
page=$prefix/share/man/man1/shmlink.1.gz
gzip -dc "$page" | grep -q '^\.TH shmlink 1' || fail "$page has no .TH header"
page3=$prefix/share/man/man3/shmlink_connect.3.gz
gzip -dc "$page3" | grep -q '^\.TH SHMLINK_CONNECT 3' || fail "$page3 has no .TH header"
if command -v man >/dev/null; then
  man_out=$(MANPAGER=cat MANWIDTH=100 man -l "$page" 2>&1) || fail "man -l $page: $man_out"
  grep -q SYNOPSIS <<<"$man_out" || fail "man shmlink has no SYNOPSIS: $man_out"
  man_out=$(MANPAGER=cat MANWIDTH=100 man -l "$page3" 2>&1) || fail "man -l $page3: $man_out"
  grep -q "shmlink_socket \*shmlink_connect(const char \*addr" <<<"$man_out" &&
    grep -q ECONNREFUSED <<<"$man_out" || fail "man 3 shmlink_connect: $man_out"
  if [[ $prefix == /usr ]]; then
    man -w shmlink-run >/dev/null || fail "man -w shmlink-run finds no page"
    man -w 3 shmlink_connect >/dev/null || fail "man -w 3 shmlink_connect finds no page"
  fi
fi
ok "man shmlink and man 3 shmlink_connect render ($(ls "$prefix/share/man/man1" | grep -c '^shmlink') pages in man1, $(ls "$prefix/share/man/man3" | grep -c '^shmlink') in man3)"
grep -q "shmlink" "$prefix/share/bash-completion/completions/shmlink" &&
  [[ -s $prefix/share/zsh/site-functions/_shmlink && -s $prefix/share/fish/vendor_completions.d/shmlink.fish ]] ||
  fail "completions missing"
ok "bash, zsh and fish completions"
echo "install-check: $n checks passed ($prefix)"
