#!/usr/bin/env bash
# The vm: transport between two QEMU guests and between a guest and the host (one boot,
# TCG here, ~1-2 min): scripts/test.sh runs it. Every check is the shmlink CLI's own
# verified pong runs (each message's sequence number and checksum are checked by the
# server) read back from the guests' consoles, and the exit status of `scripts/vm.sh run`
# (every guest's and the host's command) counts as a check of its own. Where QEMU cannot
# run, every check is reported as skipped (the skip log, category qemu), never as passed;
# with SHMLINK_REQUIRE naming qemu (or all) every such skip, guest_rung_by_msix's (no
# virtual IOMMU) included, is a failure.
#
#   scripts/vm-test.sh            ends with "vm guests: N passed, N failed[, N skipped]"
#                                 and the same as a libtest "test result:" line
set -euo pipefail
cd "$(dirname "$0")/.."
checks=(guest_ordered_100k guest_sizes_1b_16mib guest_latency guest_killed_process_resets
  guest_serves_after_a_death guest_hostile_scribble_is_a_violation guest_serves_after_a_scribble
  host_guest_sizes host_guest_ordered host_killed_guest_resets
  guest_auto_upgrades_to_vm guest_auto_other_region_stays_tcp guest_auto_no_region_stays_tcp
  guest_conform_echo guest_conform_flow_control guest_conform_nonblocking_poll
  guest_conform_graceful_close host_guest_conform_echo host_guest_conform_flow_control
  host_guest_conform_nonblocking_poll host_guest_conform_graceful_close guest_ls_vm
  guest_rung_by_msix vm_run_exit_status)

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
# --verify all: the server checksums every byte of every message and says "all verified".
p='shmlink pong --client --cpus none --verify all'
# Guest a serves pong over vm:, pong over auto: (offering its region: SHMLINK_AUTO_VM=auto
# finds the ivshmem device) and the conformance scenarios over vm:.
a='shmlink pong --server vm:pong >/tmp/s 2>&1 & s1=$!
SHMLINK_AUTO_VM=auto shmlink pong --server auto:0.0.0.0:7000 >/tmp/t 2>&1 & s2=$!
shmlink conform --server vm:conform >/tmp/c 2>&1 & s3=$!
nc -l -p 9000 >/dev/null
kill $s1 $s2 $s3; wait; cat /tmp/s /tmp/t /tmp/c'
b="sleep 2
# auto: between the guests: with the shared region it upgrades to vm:; with another
# region (a guest-local file: another id) or none it stays on TCP (virtio-net).
SHMLINK_AUTO_VM=auto $p --json -n 2000 -m 65 auto:192.0.2.1:7000
dd if=/dev/zero of=/tmp/other bs=1M count=0 seek=16 2>/dev/null; chmod 600 /tmp/other
SHMLINK_AUTO_VM=/tmp/other $p --json -n 2000 -m 66 auto:192.0.2.1:7000
$p --json -n 2000 -m 67 auto:192.0.2.1:7000
# shmlink ls --vm in guest b: guest a's and the host's listeners, read from the region.
echo '== ls'; shmlink ls --vm; echo '== ls end'
echo '== conform guest'
shmlink conform vm:conform
echo '== conform host'
shmlink conform vm:hostconform
echo '== conform end'
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
# Spinning off: guest b sleeps until guest a's doorbell arrives as its MSI-X interrupt
# (VFIO behind the virtual IOMMU); the vector's count is sampled while the pong runs (the
# line is gone once pong closes the device). Most answers are there at the first look
# (p50 about 3 µs), so the run is made long enough for many samples: 2,200 round trips
# sampled every 50 ms once read a count of 0, most likely taken as the run began.
(while :; do grep vfio-msix /proc/interrupts >/tmp/i.now && mv /tmp/i.now /tmp/i; sleep 0.01; done) & w=\$!
SHMLINK_VM_SPINS=0 $p --latency --spin-us 0 -n 10000 vm:pong
kill \$w; echo \"spin-0 vfio-msix: \$(cat /tmp/i 2>/dev/null || echo none)\"
for m in 1 1M 16M; do $p -m \$m -n 4 vm:hostpong; done
$p -n 20000 -m 200 vm:hostpong
echo done | nc 192.0.2.1 9000
# The whole guest dies while streaming to the host: no process exits, the guest is gone.
$p -n 100000000 -m 300 vm:hostpong >/dev/null 2>&1 & sleep 4
echo '=== SHMLINK-VM-EXIT 0'
poweroff -f"
set +e
scripts/vm.sh run --timeout 300 --host-linger 4 --a "$a" --b "$b" \
  --host "trap 'kill \$h1 \$h2' TERM
$bin pong --server vm:hostpong@\$SHMLINK_VM_REGION & h1=\$!
$bin conform --server vm:hostconform@\$SHMLINK_VM_REGION & h2=\$!
wait" >"$out" 2>&1
rc=$?
set -e
cat "$out"
section() { sed -n "/^--- $1\$/,/^--- /p" "$out"; }
ga=$(section 'guest a'); gb=$(section 'guest b'); host=$(section host)
cg=$(sed -n '/^== conform guest/,/^== conform host/p' <<<"$gb")
ch=$(sed -n '/^== conform host/,/^== conform end/p' <<<"$gb")
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
irqs=$(sed -n 's/^spin-0 vfio-msix: *[0-9]*: *\([0-9]*\) .*/\1/p' <<<"$gb")
if [ "$(scripts/vm.sh viommu)" = 1 ]; then
  ok=$(has "$ga" 'served a latency run: 11000 messages of 64 bytes, all verified')
  [ "${irqs:-0}" -gt 0 ] || ok=1
  echo "vm-test: guest b's vfio-msix[0] count after the spin-0 pong: ${irqs:-none}"
  check guest_rung_by_msix "$ok"
else
  why="no virtual IOMMU for the guests (scripts/vm.sh viommu)"
  case ",${SHMLINK_REQUIRE:-}," in
    *,qemu,* | *,all,*)
      echo "vm-test: guest_rung_by_msix cannot run: $why, but SHMLINK_REQUIRE=$SHMLINK_REQUIRE"
      check guest_rung_by_msix 1 ;;
    *)
      line="SKIPPED scripts/test.sh::vm_guest_rung_by_msix: $why [qemu]"
      echo "$line" >&2
      [ -z "${SHMLINK_SKIP_LOG:-}" ] || echo "$line" >>"$SHMLINK_SKIP_LOG" ;;
  esac
fi
auto() { # size, transport: the client's JSON line and the server's verified run agree
  [ "$(has "$gb" "\"transport\":\"$2\",\"size\":$1,")" = 0 ] &&
    [ "$(has "$ga" "[0-9]+ messages of $1 bytes, all verified \(over $2\)")" = 0 ]
  echo $?
}
check guest_auto_upgrades_to_vm "$(auto 65 vm)"
check guest_auto_other_region_stays_tcp "$(auto 66 tcp)"
check guest_auto_no_region_stays_tcp "$(auto 67 tcp)"
conform() { # prefix, client lines, server lines
  check "$1_echo" "$([ "$(has "$2" 'conform: echo ok over vm: 420 messages .* all verified')" = 0 ] &&
    [ "$(has "$3" 'served over vm: echo: 420 messages echoed')" = 0 ]; echo $?)"
  check "$1_flow_control" "$(has "$2" 'conform: flow ok over vm: WouldBlock after [0-9]+ of 2000 .* verified all 2000 in order')"
  check "$1_nonblocking_poll" "$(has "$2" 'conform: poll ok over vm: recv WouldBlock before .* all verified')"
  check "$1_graceful_close" "$([ "$(has "$2" 'conform: close-out ok over vm: .* then end of stream')" = 0 ] &&
    [ "$(has "$3" 'served over vm: close-in: 1000 messages verified, then end of stream')" = 0 ]; echo $?)"
}
lsv=$(sed -n '/^== ls$/,/^== ls end/p' <<<"$gb")
ok=0
for n in pong conform hostpong hostconform 'auto-7000-[0-9a-f]+'; do
  [ "$(has "$lsv" "^vm:$n +[0-9]+ +live")" = 0 ] || ok=1
done
check guest_ls_vm $ok
conform guest_conform "$cg" "$ga"
conform host_guest_conform "$ch" "$host"
# Every guest command and the host command ran to its end with status 0 (a guest that
# timed out or a command that failed shows here even where the lines above were printed).
[ "$rc" = 0 ] || echo "vm-test: scripts/vm.sh run exited $rc"
check vm_run_exit_status "$rc"
echo "vm guests: $pass passed, $fail failed"
# The same in libtest's words, which scripts/test.sh's closing count reads.
echo "test result: $([ "$fail" = 0 ] && echo ok || echo FAILED). $pass passed; $fail failed; 0 ignored; 0 measured; 0 filtered out (vm guests)"
[ "$fail" = 0 ]
