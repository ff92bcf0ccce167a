#!/usr/bin/env bash
# The vm: transport between two QEMU guests and between a guest and the host (one boot,
# TCG here, ~1-2 min): scripts/test.sh runs it. Every check is the shmlink CLI's own
# verified pong runs (each message's sequence number and checksum are checked by the
# server) read back from the guests' consoles. Where QEMU cannot run, every check is
# reported as skipped (the skip log, category qemu), never as passed.
#
#   scripts/vm-test.sh            ends with "vm guests: N passed, N failed[, N skipped]"
#                                 and the same as a libtest "test result:" line
set -euo pipefail
cd "$(dirname "$0")/.."
checks=(guest_ordered_100k guest_sizes_1b_16mib guest_latency guest_killed_process_resets
  guest_serves_after_a_death guest_hostile_scribble_is_a_violation guest_serves_after_a_scribble
  host_guest_sizes host_guest_ordered host_killed_guest_resets)

skip_all() {
  echo "vm-test: SKIPPED (qemu): $1"
  for c in "${checks[@]}"; do
    line="SKIPPED scripts/test.sh::vm_$c: $1 [qemu]"
    echo "$line" >&2
    [ -z "${SHMLINK_SKIP_LOG:-}" ] || echo "$line" >>"$SHMLINK_SKIP_LOG"
  done
  case ",${SHMLINK_REQUIRE:-}," in
    *,qemu,*|*,all,*) echo "vm guests: 0 passed, ${#checks[@]} failed (SHMLINK_REQUIRE has qemu)"; exit 1 ;;
  esac
  echo "vm guests: 0 passed, 0 failed, ${#checks[@]} skipped"
  echo "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out (vm guests, skipped)"
  exit 0
}

why=$(scripts/vm.sh check 2>&1) || skip_all "$why"
scripts/vm.sh image >/dev/null 2>&1 || skip_all "building the guest image failed: $(scripts/vm.sh image 2>&1 | tail -3 | tr '\n' ' ')"

out=$(mktemp)
trap 'rm -f "$out"' EXIT
bin=$PWD/target/release/shmlink
p='shmlink pong --client --cpus none'
a='shmlink pong --server vm:pong >/tmp/s 2>&1 &
nc -l -p 9000 >/dev/null
kill %1; wait; cat /tmp/s'
b="sleep 2
$p -n 100000 vm:pong
for m in 1 4k 1M 16M; do $p -m \$m -n 4 vm:pong; done
$p --latency -n 500 vm:pong
$p -n 100000000 vm:pong >/dev/null 2>&1 & sleep 4; kill -9 \$!; sleep 3
$p -n 1000 -m 100 vm:pong
# A hostile guest: through /dev/mem (the BAR's physical address), write a state no
# correct peer writes into the live connection's slot (slots at 8192, 2048 bytes each,
# state word first). A ring position would be rewritten by its producer at its next
# message; the state word stays, so the check does not race the stream.
$p -n 100000000 -m 64 vm:pong >/dev/null 2>&1 & v=\$!; sleep 4
for d in /sys/bus/pci/devices/*; do [ \$(cat \$d/device) = 0x1110 ] && base=\$(sed -n 3p \$d/resource | cut -d' ' -f1); done
i=0; while [ \$i -lt 64 ]; do
  st=\$((base + 8192 + i * 2048))
  [ \$((\$(devmem \$st 32))) = 3 ] && devmem \$st 32 7 && echo scribbled slot \$i
  i=\$((i + 1))
done
wait \$v; echo the scribbled client exited \$?
$p -n 1000 -m 120 vm:pong
for m in 1 1M 16M; do $p -m \$m -n 4 vm:hostpong; done
$p -n 20000 -m 200 vm:hostpong
echo done | nc 192.0.2.1 9000
# The whole guest dies while streaming to the host: no process exits, the guest is gone.
$p -n 100000000 -m 300 vm:hostpong >/dev/null 2>&1 & sleep 4
echo '=== SHMLINK-VM-EXIT 0'
poweroff -f"
set +e
scripts/vm.sh run --timeout 300 --host-linger 4 --a "$a" --b "$b" \
  --host "exec $bin pong --server vm:hostpong@\$SHMLINK_VM_REGION" >"$out" 2>&1
rc=$?
set -e
cat "$out"
section() { sed -n "/^--- $1\$/,/^--- /p" "$out"; }
ga=$(section 'guest a'); host=$(section host)
pass=0 fail=0
check() {
  if [ "$2" = 0 ]; then pass=$((pass + 1)); echo "vm-test: ok   $1"
  else fail=$((fail + 1)); echo "vm-test: FAIL $1"; fi
}
has() { grep -qE "$2" <<<"$1"; echo $?; }
check guest_ordered_100k "$(has "$ga" 'served a throughput run: 101000 messages of 64 bytes, all verified')"
ok=0
for n in 1 4096 1048576 16777216; do
  [ "$(has "$ga" "served a throughput run: [0-9]+ messages of $n bytes, all verified")" = 0 ] || ok=1
done
check guest_sizes_1b_16mib $ok
check guest_latency "$(has "$ga" 'served a latency run: 550 messages of 64 bytes, all verified')"
check guest_killed_process_resets "$(has "$ga" 'client on vm:pong.*(heartbeat stopped|reset|left without closing)')"
check guest_serves_after_a_death "$(has "$ga" 'served a throughput run: 1100 messages of 100 bytes, all verified')"
check guest_hostile_scribble_is_a_violation "$(has "$ga" 'client on vm:pong: .*slot [0-9]+ state changed to 7')"
check guest_serves_after_a_scribble "$(has "$ga" 'served a throughput run: 1100 messages of 120 bytes, all verified')"
ok=0
for n in 1 1048576 16777216; do
  [ "$(has "$host" "served a throughput run: [0-9]+ messages of $n bytes, all verified")" = 0 ] || ok=1
done
check host_guest_sizes $ok
check host_guest_ordered "$(has "$host" 'served a throughput run: 21000 messages of 200 bytes, all verified')"
check host_killed_guest_resets "$(has "$host" 'client on vm:hostpong.*heartbeat stopped')"
[ "$rc" = 0 ] || echo "vm-test: scripts/vm.sh run exited $rc"
echo "vm guests: $pass passed, $fail failed"
# The same in libtest's words, which scripts/test.sh's closing count reads.
echo "test result: $([ "$fail" = 0 ] && echo ok || echo FAILED). $pass passed; $fail failed; 0 ignored; 0 measured; 0 filtered out (vm guests)"
[ "$fail" = 0 ]
