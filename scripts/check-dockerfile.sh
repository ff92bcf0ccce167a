#!/usr/bin/env bash
# Builds deploy/Dockerfile's build stage the way its base image would, without Docker:
# the `RUN` commands of the stage that is `FROM … AS build` are read from the Dockerfile
# (so this check follows every change there) and run here, in the repository root (the
# stage's `COPY . .`), with the stage's `ENV`, in an environment cut down to what the
# `rust:*-slim-*` image has: Debian's essential packages, ca-certificates, gcc, libc6-dev,
# wget and rustup — no C++ compiler, no cmake, no make, no pkg-config.
#
#   1. The packages the command builds must not need a tool the image lacks: crates that
#      compile C++ (zmq-sys builds libzmq) or run cmake are reported from `cargo tree`
#      before anything is compiled.
#   2. The build runs with PATH reduced to the image's programs (taken from dpkg's file
#      lists of those packages where dpkg exists, else PATH without C++ compilers, cmake
#      and pkg-config) and CXX=false, so anything that still reaches for a C++ compiler
#      fails. Artifacts go to target/dockerfile-check (the stage's cache mount of
#      /src/target), which never sees a build with C++.
#   3. The stage's other commands (`install … /out/…`) run with /out under a temporary
#      directory, and the binary they install must run (`--help`, the image's CMD).
#   4. The runtime stage's `apt-get install` packages must be known to apt here (a warning
#      only: this machine's package lists may be of another Debian release).
#
# usage: scripts/check-dockerfile.sh [--full] [DOCKERFILE]
#   --full   build even when step 1 found a problem (to see the compiler's own error)
set -euo pipefail
cd "$(dirname "$0")/.."

full=
dockerfile=deploy/Dockerfile
for arg in "$@"; do
  case $arg in
    --full) full=1 ;;
    -*) echo "usage: $0 [--full] [DOCKERFILE]" >&2; exit 2 ;;
    *) dockerfile=$arg ;;
  esac
done
[ -f "$dockerfile" ] || { echo "no $dockerfile" >&2; exit 2; }

# The Dockerfile's instructions, one per line: continuation lines joined, comments and
# blank lines dropped.
instructions() {
  sed -e '/^[[:space:]]*#/d' "$dockerfile" |
    awk '{ if (sub(/\\[[:space:]]*$/, "")) { buf = buf $0 " " } else { print buf $0; buf = "" } }' |
    sed -e 's/[[:space:]]\+/ /g' -e 's/^ //' -e '/^$/d'
}

# The instructions of the stage named `build` (from its FROM to the next FROM).
stage=$(instructions | awk '
  toupper($1) == "FROM" { inside = (tolower($(NF-1)) == "as" && $NF == "build") }
  inside')
[ -n "$stage" ] || { echo "$dockerfile: no stage 'FROM … AS build'" >&2; exit 1; }
# The base image, with the ARG defaults filled in (ARG NAME=VALUE before the first FROM).
image=$(echo "$stage" | head -1 | awk '{ print $2 }')
while read -r name value; do
  image=${image//\$\{$name\}/$value}
done < <(instructions | awk -F'[ =]' 'toupper($1) == "ARG" && NF >= 3 { print $2, $3 }')
echo "== $dockerfile, stage 'build' on $image"

# The stage's ENV (KEY=VALUE pairs), exported for the build.
envs=()
while read -r line; do
  for pair in $line; do
    case $pair in *=*) envs+=("$pair") ;; esac
  done
done < <(echo "$stage" | awk 'toupper($1) == "ENV" { $1 = ""; print }')

# The stage's RUN commands, split at `&&`, without RUN and its --mount options.
commands=()
while read -r run; do
  run=$(echo "$run" | sed -e 's/^RUN //' -e 's/--mount=[^ ]* //g')
  while [ -n "$run" ]; do
    part=${run%%&&*}
    [ "$part" = "$run" ] && run= || run=${run#*&&}
    part=$(echo "$part" | sed -e 's/^ *//' -e 's/ *$//')
    [ -n "$part" ] && commands+=("$part")
  done
done < <(echo "$stage" | awk 'toupper($1) == "RUN"')
build=
for c in "${commands[@]}"; do
  case $c in "cargo build "*) build=$c ;; esac
done
[ -n "$build" ] || { echo "$dockerfile: the build stage runs no 'cargo build'" >&2; exit 1; }
echo "   ENV ${envs[*]:-(none)}"
for c in "${commands[@]}"; do echo "   RUN $c"; done

echo "== 1. what the build needs that $image lacks (cargo tree)"
# The packages and features the command selects, as cargo tree takes them (it has no --bin
# and no --release; --locked as the command has it).
read -ra words <<<"$build"
tree_args=()
i=2
while [ $i -lt ${#words[@]} ]; do
  w=${words[$i]}
  case $w in
    -p | --package | -F | --features) tree_args+=("$w" "${words[$((i + 1))]}"); i=$((i + 1)) ;;
    --no-default-features | --all-features | --locked | --frozen | --offline) tree_args+=("$w") ;;
  esac
  i=$((i + 1))
done
problems=$(cargo tree "${tree_args[@]}" -e normal,build --prefix none 2>/dev/null |
  awk '{ print $1 }' | sort -u | awk '
    $1 == "zmq-sys"   { print "zmq-sys: compiles libzmq from C++ sources (the image has no C++ compiler)" }
    $1 == "cmake"     { print "cmake: runs the cmake program (not in the image)" }')
if [ -n "$problems" ]; then
  echo "$problems" | sed 's/^/   /'
  echo "   (cargo tree ${tree_args[*]} -e normal,build -i CRATE shows who pulls each in)"
  if [ -z "$full" ]; then
    echo "FAILED: the build stage needs tools $image does not have (--full builds anyway)"
    exit 1
  fi
else
  echo "   none"
fi

echo "== 2. the build, with only the image's programs on PATH and CXX=false"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bin=$work/bin
mkdir -p "$bin"
cargo_dir=$(dirname "$(command -v cargo)")
if command -v dpkg-query >/dev/null && command -v apt-cache >/dev/null; then
  # Essential packages plus what the rust slim images install, with their dependencies,
  # as far as they are installed here.
  pkgs=$( {
    dpkg-query -W -f='${Package} ${Essential}\n' | awk '$2 == "yes" { print $1 }'
    apt-cache depends --recurse --installed --no-recommends --no-suggests --no-conflicts \
      --no-breaks --no-replaces --no-enhances ca-certificates gcc libc6-dev wget 2>/dev/null |
      grep -v '^[[:space:]<]'
  } | sed 's/:.*//' | sort -u)
  # shellcheck disable=SC2086
  dpkg -L $pkgs 2>/dev/null | grep -E '^(/usr)?/s?bin/[^/]+$' | sort -u |
    while read -r f; do
      [ -x "$f" ] && [ ! -e "$bin/${f##*/}" ] && ln -s "$f" "$bin/${f##*/}"
    done
  # Debian's gcc package makes `cc` an alternative for gcc (its postinst, not its files).
  [ -e "$bin/gcc" ] && [ ! -e "$bin/cc" ] && ln -s "$(readlink "$bin/gcc")" "$bin/cc"
  echo "   PATH: $(ls "$bin" | wc -l) programs of $(echo "$pkgs" | wc -l) packages, and $cargo_dir"
else
  IFS=: read -ra dirs <<<"$PATH"
  for d in "${dirs[@]}"; do
    for f in "$d"/*; do
      name=${f##*/}
      case $name in
        *++* | cmake* | pkg-config | *-pkg-config | clang* | llvm-config*) continue ;;
      esac
      [ -x "$f" ] && [ ! -e "$bin/$name" ] && ln -s "$f" "$bin/$name"
    done
  done
  echo "   PATH: every program here except C++ compilers, clang, cmake and pkg-config"
fi
for tool in c++ g++ clang++ cmake make pkg-config; do
  if [ -e "$bin/$tool" ]; then echo "   $tool is on the reduced PATH: the check is wrong" >&2; exit 1; fi
done
for tool in cc gcc; do
  [ -e "$bin/$tool" ] || { echo "   $tool is missing from the reduced PATH (the image has it)" >&2; exit 1; }
done

target=$PWD/target/dockerfile-check
out=$work/out
# The stage's paths: /src/target is the cache mount (here target/dockerfile-check), /out
# a directory of the build stage (here under the temporary directory).
rewrite() { echo "$1" | sed -e "s#\(^\| \)target/#\1$target/#g" -e "s#/out/#$out/#g"; }
for c in "${commands[@]}"; do
  c=$(rewrite "$c")
  echo "   \$ $c"
  if ! env "${envs[@]}" PATH="$bin:$cargo_dir" CXX=false CARGO_TARGET_DIR="$target" \
    bash -c "$c"; then
    echo "FAILED: the build stage's command failed in an environment like $image"
    exit 1
  fi
done

echo "== 3. the installed binary runs"
# The shmlink program if the stage installed one (a whole image tree holds libraries with
# the executable bit too), else the first executable.
installed=$(find "$out" -type f -name shmlink -perm -u+x | head -1)
[ -n "$installed" ] || installed=$(find "$out" -type f -perm -u+x | head -1)
[ -n "$installed" ] || { echo "FAILED: the build stage installed no program under /out"; exit 1; }
# The image's CMD (exec form, `CMD ["arg", …]`) as the arguments, as `docker run` would.
cmd=()
while read -r a; do
  [ -n "$a" ] && cmd+=("$a")
done < <(instructions | awk 'toupper($1) == "CMD"' | tail -1 |
  sed -e 's/^CMD *\[//' -e 's/\] *$//' | tr ',' '\n' | sed -e 's/^ *"//' -e 's/" *$//')
"$installed" "${cmd[@]}" >/dev/null
echo "   ${installed#"$work"} ${cmd[*]}: ok"

echo "== 4. the runtime stage's Debian packages"
for pkg in $(instructions | awk '
  toupper($1) == "FROM" { runtime = !(tolower($(NF-1)) == "as" && $NF == "build") }
  runtime && toupper($1) == "RUN" {
    for (i = 1; i <= NF; i++) {
      if ($i == "install" && ($(i-1) == "apt-get" || $(i-1) == "apt")) inst = 1
      else if (inst && ($i == "&&" || $i ~ /;$/)) inst = 0
      else if (inst && $i !~ /^-/) print $i
    } }'); do
  if ! command -v apt-cache >/dev/null; then
    echo "   $pkg: not checked (no apt-cache here)"
  elif apt-cache show "$pkg" >/dev/null 2>&1; then
    echo "   $pkg: known to apt"
  else
    echo "   WARNING: $pkg is unknown to apt here (run apt-get update; lists may be of another release)"
  fi
done
echo "dockerfile check: ok"
