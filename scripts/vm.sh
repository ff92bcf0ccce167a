#!/usr/bin/env bash
# Two QEMU guests with one shared ivshmem region and a virtual network between them, for
# shmlink's vm: transport (docs/vms.md). Every boot has a deadline.
#
#   scripts/vm.sh install          install qemu-system-x86, linux-image-amd64,
#                                  busybox-static and cpio from Debian if missing (apt-get)
#   scripts/vm.sh image            build target/vm/initrd.img: busybox, the shmlink CLI
#                                  (target/release/shmlink, built if missing) and what
#                                  `ldd` lists, the virtio-net modules, an /init
#   scripts/vm.sh accel            print the accelerator the guests use: kvm if a guest
#                                  boots under it within 20 s (cached in target/vm/accel),
#                                  else tcg ($SHMLINK_VM_ACCEL overrides)
#   scripts/vm.sh viommu           print 1 if guests boot on q35 with a virtual IOMMU
#                                  (intel-iommu, so vfio-pci can deliver doorbells to
#                                  guests; a success is cached in target/vm/viommu-ACCEL), else 0
#                                  ($SHMLINK_VM_VIOMMU overrides)
#   scripts/vm.sh run [options]    boot guests a and b (and run a host command), print each
#                                  one's output, exit non-zero if any command failed
#       --a CMD / --b CMD          shell command run in guest a / b (b optional)
#       --host CMD                 shell command run on the host meanwhile (SIGTERM once
#                                  both guests are done), with $SHMLINK_VM_REGION set to
#                                  the region's backing file
#       --host-linger S            seconds the host command goes on after the guests are
#                                  done (default 0), e.g. to see a dead guest's reset
#       --timeout S                deadline for the whole run (default 180 s)
#       --region-mib N             region size (default 64; a power of two, ≥ 4)
#       --keep DIR                 keep the run directory (outputs, region) in DIR
#       --plain                    ivshmem-plain (no doorbells, no server) instead of the
#                                  default: ivshmem-doorbell, each QEMU connected to a
#                                  `shmlink vm-host` this script starts (socket
#                                  REGION.bell, which host commands use as well)
#   scripts/vm.sh check            exit 0 if guests can run here (the tools are
#                                  installed, /boot has a kernel); 1 with the reason
#
# In a guest: guest a is 192.0.2.1, guest b 192.0.2.2 (a documentation range, carried
# only inside QEMU's socket netdev over 127.0.0.1), the region is the ivshmem device's
# BAR 2 (found by the vm: transport itself, or $SHMLINK_VM_REGION), `shmlink` is on PATH,
# /tmp is a tmpfs, and $SHMLINK_VM_DEAD_MS is 1000 (TCG guests stall; docs/vms.md).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$root/target/vm
mkdir -p "$work"

die() { echo "vm.sh: $*" >&2; exit 1; }

kernel() { ls /boot/vmlinuz-*-amd64 2>/dev/null | sort -V | tail -1; }

cmd_check() {
  command -v qemu-system-x86_64 >/dev/null || { echo "qemu-system-x86_64 not installed (scripts/vm.sh install)"; return 1; }
  [ -x /bin/busybox ] || { echo "busybox-static not installed (scripts/vm.sh install)"; return 1; }
  command -v cpio >/dev/null || { echo "cpio not installed (scripts/vm.sh install)"; return 1; }
  [ -n "$(kernel)" ] && [ -r "$(kernel)" ] || { echo "no readable /boot/vmlinuz-*-amd64 (linux-image-amd64)"; return 1; }
  [ -d /dev/shm ] || { echo "no /dev/shm for the region"; return 1; }
  return 0
}

cmd_install() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  [ -n "$(kernel)" ] || need+=(linux-image-amd64)
  { [ -x /bin/busybox ] && /bin/busybox --help 2>&1 | grep -q static; } ||
    dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  if [ ${#need[@]} -gt 0 ]; then
    echo "vm.sh: installing ${need[*]}"
    local sudo=
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
  fi
  cmd_check
}

# Copies a file and its directory path into the image tree.
put() { mkdir -p "$img/$(dirname "$1")"; cp -L "$1" "$img/$1"; }

cmd_image() {
  cmd_check >/dev/null || die "$(cmd_check)"
  local bin=$root/target/release/shmlink
  if [ ! -x "$bin" ] || [ -n "$(find "$root/crates" -newer "$bin" -name '*.rs' -print -quit)" ]; then
    echo "vm.sh: building the shmlink CLI (release)"
    CARGO_INCREMENTAL=0 cargo build -q -p shmlink-cli --release
  fi
  local k; k=$(kernel)
  local kver=${k#/boot/vmlinuz-}
  img=$work/rootfs
  rm -rf "$img"; mkdir -p "$img"/{bin,sbin,proc,sys,dev,tmp,etc,lib/modules}
  cp /bin/busybox "$img/bin/busybox"
  cp "$bin" "$img/bin/shmlink"
  # The libraries the CLI links, and the dynamic loader.
  for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do put "$lib"; done
  # virtio-net and what it needs (virtio-pci for the NIC; ivshmem needs no driver).
  # VFIO (vfio-pci bound to the ivshmem device in the guest: its MSI-X vector becomes an
  # eventfd, docs/vms.md "Waiting") — needs the virtual IOMMU of the q35 machine.
  local mods="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover net_failover virtio_net"
  mods="$mods irqbypass vfio_virqfd vfio vfio_iommu_type1 vfio-pci-core vfio-pci"
  : >"$img/lib/modules/order"
  for m in $mods; do
    local f; f=$(find "/lib/modules/$kver" -name "$m.ko*" | head -1)
    [ -n "$f" ] || continue
    case $f in
      *.xz) xz -dc "$f" >"$img/lib/modules/$m.ko" ;;
      *.zst) zstd -qdc "$f" >"$img/lib/modules/$m.ko" ;;
      *) cp "$f" "$img/lib/modules/$m.ko" ;;
    esac
    echo "$m" >>"$img/lib/modules/order"
  done
  cat >"$img/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp; mkdir -p /dev/shm; mount -t tmpfs shm /dev/shm
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m.ko 2>/dev/null; done
role=$(sed -n 's/.*shmlink.role=\([a-z]\).*/\1/p' /proc/cmdline)
case $role in a) n=1 ;; *) n=2 ;; esac
ip link set lo up
for i in 1 2 3 4 5 6 7 8 9 10; do [ -e /sys/class/net/eth0 ] && break; sleep 0.2; done
ip addr add 192.0.2.$n/24 dev eth0 && ip link set eth0 up
# Memory decoding on for the ivshmem BAR (the transport maps resource2 through sysfs).
# With a virtual IOMMU (IOMMU groups exist) and the doorbell variant (an MSI-X capability),
# vfio-pci takes the device: the vm: transport asks it for MSI-X vector 0 as an eventfd.
for d in /sys/bus/pci/devices/*; do
  if [ "$(cat $d/vendor)" = 0x1af4 ] && [ "$(cat $d/device)" = 0x1110 ]; then
    echo 1 >$d/enable 2>/dev/null
    if [ -e $d/iommu_group ] && [ -e /sys/bus/pci/drivers/vfio-pci ] && [ -n "$(cat /proc/cmdline | grep -o shmlink.vfio=1)" ]; then
      echo vfio-pci >$d/driver_override
      echo ${d##*/} >/sys/bus/pci/drivers/vfio-pci/bind 2>/dev/null &&
        echo "vm-init: ${d##*/} bound to vfio-pci (group $(basename $(readlink $d/iommu_group)))" >/dev/console
    fi
  fi
done
export SHMLINK_VM_DEAD_MS=1000 HOME=/tmp SHMLINK_DIR=/tmp/shmlink
echo "=== SHMLINK-VM-BEGIN $role"
sh /cmd.sh
echo "=== SHMLINK-VM-EXIT $?"
poweroff -f
EOF
  chmod +x "$img/init"
  (cd "$img" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.img"
  rm -rf "$img"
  echo "vm.sh: image $work/initrd.img ($(du -h "$work/initrd.img" | cut -f1)), kernel $k"
}

# Sets QEMU to the qemu-system-x86_64 command line for guest $1 (a|b) with accel $2,
# writing its console to $3.
qemu_cmd() {
  local role=$1 accel=$2 out=$3 initrd=$4 region=$5 mib=$6 net=$7 bell=${8:-}
  local mac=52:54:00:00:00:0$([ "$role" = a ] && echo 1 || echo 2)
  local append="console=ttyS0 quiet panic=-1 shmlink.role=$role"
  QEMU=(qemu-system-x86_64 -nodefaults -no-reboot -display none -monitor none -m 256 -smp 1)
  if [ "${VIOMMU:-0}" = 1 ]; then
    # q35 with a virtual IOMMU (interrupt remapping on), so that the guest's vfio-pci can
    # take the ivshmem-doorbell device and turn its MSI-X vector into an eventfd. The
    # IOMMU must come before the other PCI devices; KVM needs the split irqchip for it.
    if [ "$accel" = kvm ]; then
      QEMU+=(-machine q35,kernel-irqchip=split -accel kvm)
    else
      QEMU+=(-machine q35 -accel "$accel")
    fi
    QEMU+=(-device intel-iommu,intremap=on)
    # no_timer_check: under TCG on a loaded host the kernel's check of the timer through
    # the interrupt-remapped IO-APIC can miss its window and panic ("timer doesn't work
    # through Interrupt-remapped IO-APIC"); the timer works.
    append="$append intel_iommu=on no_timer_check${bell:+ shmlink.vfio=1}"
  else
    QEMU+=(-accel "$accel")
  fi
  [ "$accel" = kvm ] && QEMU+=(-cpu host)
  QEMU+=(-kernel "$(kernel)" -initrd "$initrd"
    -append "$append"
    -serial "file:$out"
    -netdev "socket,id=n0,$net" -device "virtio-net-pci,netdev=n0,mac=$mac")
  if [ -n "$bell" ]; then
    # The region and the eventfds come from the server (vm-host) over the socket.
    QEMU+=(-chardev "socket,path=$bell,id=ivs" -device ivshmem-doorbell,chardev=ivs,vectors=1)
  else
    QEMU+=(-object "memory-backend-file,id=shm0,mem-path=$region,size=${mib}M,share=on"
      -device ivshmem-plain,memdev=shm0)
  fi
}

# A per-guest initrd: the image plus a cpio holding /cmd.sh.
guest_initrd() {
  local dir=$1 role=$2 cmd=$3
  mkdir -p "$dir/cmd-$role"
  printf '%s\n' "$cmd" >"$dir/cmd-$role/cmd.sh"
  (cd "$dir/cmd-$role" && echo cmd.sh | cpio -o -H newc --quiet | gzip -1) >"$dir/cmd-$role.cpio.gz"
  cat "$work/initrd.img" "$dir/cmd-$role.cpio.gz" >"$dir/initrd-$role.img"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

cmd_accel() {
  if [ -n "${SHMLINK_VM_ACCEL:-}" ]; then echo "$SHMLINK_VM_ACCEL"; return; fi
  if [ -f "$work/accel" ]; then cat "$work/accel"; return; fi
  local accel=tcg
  if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    [ -f "$work/initrd.img" ] || cmd_image >&2
    local d; d=$(mktemp -d /tmp/shmlink-vm-probe.XXXXXX)
    guest_initrd "$d" a 'true'
    truncate -s 16M "$d/region"
    qemu_cmd a kvm "$d/out" "$d/initrd-a.img" "$d/region" 16 "listen=127.0.0.1:$(free_port)"
    if timeout -k 2 20 "${QEMU[@]}" >/dev/null 2>&1 && grep -q '=== SHMLINK-VM-EXIT 0' "$d/out" 2>/dev/null; then
      accel=kvm
    fi
    rm -rf "$d"
  fi
  echo "$accel" >"$work/accel"
  echo "$accel"
}

# Whether guests boot on q35 with a virtual IOMMU under accel $1: a guest must boot and
# see its IOMMU within 30 s (a success is cached in target/vm/viommu-ACCEL; $SHMLINK_VM_VIOMMU=0|1
# overrides). Else the old machine (i440fx, no IOMMU: guests are not rung, they poll).
cmd_viommu() {
  local accel=$1
  if [ -n "${SHMLINK_VM_VIOMMU:-}" ]; then echo "$SHMLINK_VM_VIOMMU"; return; fi
  # A cached 1 only (a 0 an older vm.sh cached is probed again).
  if [ "$(cat "$work/viommu-$accel" 2>/dev/null)" = 1 ]; then echo 1; return; fi
  local ok=0 d; d=$(mktemp -d /tmp/shmlink-vm-probe.XXXXXX)
  guest_initrd "$d" a 'test -d /sys/class/iommu/dmar0 && test -e /sys/bus/pci/drivers/vfio-pci'
  truncate -s 16M "$d/region"
  VIOMMU=1 qemu_cmd a "$accel" "$d/out" "$d/initrd-a.img" "$d/region" 16 "listen=127.0.0.1:$(free_port)"
  if timeout -k 2 30 "${QEMU[@]}" >"$d/log" 2>&1 && grep -q '=== SHMLINK-VM-EXIT 0' "$d/out" 2>/dev/null; then
    ok=1
  else
    { echo "vm.sh: no virtual IOMMU under $accel: guests boot the old machine, guests poll"
      tail -5 "$d/log" "$d/out" 2>/dev/null; } >&2
  fi
  rm -rf "$d"
  # Only a success is cached: a probe that failed once (a slow boot, a busy machine) is
  # tried again next time instead of turning the doorbell check off for good.
  [ "$ok" = 0 ] || echo "$ok" >"$work/viommu-$accel"
  echo "$ok"
}

cmd_run() {
  local a= b= host= timeout=180 mib=64 keep= hasb= linger=0 plain=
  while [ $# -gt 0 ]; do
    case $1 in
      --a) a=$2; shift 2 ;;
      --b) b=$2; hasb=1; shift 2 ;;
      --host) host=$2; shift 2 ;;
      --timeout) timeout=$2; shift 2 ;;
      --region-mib) mib=$2; shift 2 ;;
      --keep) keep=$2; shift 2 ;;
      --host-linger) linger=$2; shift 2 ;;
      --plain) plain=1; shift ;;
      *) die "run: unknown option $1" ;;
    esac
  done
  [ -n "$a" ] || die "run: --a CMD is required"
  cmd_check >/dev/null || die "$(cmd_check)"
  [ -f "$work/initrd.img" ] || cmd_image
  local accel; accel=$(cmd_accel)
  # Doorbells reach guests only through vfio-pci, which needs the virtual IOMMU.
  VIOMMU=0
  [ -n "$plain" ] || VIOMMU=$(cmd_viommu "$accel")
  # Globals: the EXIT trap cleans them up after this function returned.
  if [ -n "$keep" ]; then d=$keep; rm -rf "$d"; mkdir -p "$d"; else d=$(mktemp -d /tmp/shmlink-vm.XXXXXX); fi
  # The region: a file in /dev/shm (QEMU maps it share=on; the host side maps it too),
  # owner-only: host processes refuse a region other users may read (docs/vms.md).
  region=/dev/shm/shmlink-vm-$$-$RANDOM
  (umask 077 && truncate -s "${mib}M" "$region")
  pids=() run_keep=$keep bellpid=
  bell=
  local port; port=$(free_port)
  cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -z "$bellpid" ] || kill "$bellpid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -f "$region" "$region.bell"
    [ -n "$run_keep" ] || rm -rf "$d"
  }
  trap cleanup EXIT
  trap 'exit 143' INT TERM  # through the EXIT trap: guests killed, region removed
  local t0; t0=$(date +%s.%N)
  if [ -z "$plain" ]; then
    # The doorbell server: QEMUs and host processes are its peers (docs/vms.md).
    bell=$region.bell
    timeout -k 5 "$timeout" "$root/target/release/shmlink" vm-host --region "$region" \
      --size-mib "$mib" --socket "$bell" -v >"$d/vm-host.log" 2>&1 &
    bellpid=$!
    for _ in $(seq 100); do [ -S "$bell" ] && break; sleep 0.1; done
    [ -S "$bell" ] || { cat "$d/vm-host.log"; die "vm-host did not listen within 10 s"; }
  fi
  guest_initrd "$d" a "$a"
  qemu_cmd a "$accel" "$d/out-a" "$d/initrd-a.img" "$region" "$mib" "listen=127.0.0.1:$port" "$bell"
  # timeout is the direct child: killing it (the EXIT trap) takes its QEMU along.
  timeout -k 5 "$timeout" "${QEMU[@]}" >"$d/qemu-a.log" 2>&1 &
  pids+=($!)
  if [ -n "$hasb" ]; then
    guest_initrd "$d" b "$b"
    # b connects to a's netdev socket; give a's QEMU a moment to listen.
    for _ in $(seq 50); do
      python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$port),0.2).close()" 2>/dev/null && break
      sleep 0.1
    done
    qemu_cmd b "$accel" "$d/out-b" "$d/initrd-b.img" "$region" "$mib" "connect=127.0.0.1:$port" "$bell"
    timeout -k 5 "$timeout" "${QEMU[@]}" >"$d/qemu-b.log" 2>&1 &
    pids+=($!)
  fi
  # The host command runs beside the guests; once both guests are done it gets SIGTERM
  # (a server's normal end: that exit status is not a failure).
  local hostpid=
  if [ -n "$host" ]; then
    SHMLINK_VM_REGION=$region SHMLINK_VM_BELL=$bell SHMLINK_VM_DEAD_MS=${SHMLINK_VM_DEAD_MS:-1000} \
      timeout -k 5 "$timeout" bash -c "$host" >"$d/out-host" 2>&1 &
    hostpid=$!
    pids+=("$hostpid")
  fi
  local rc=0 p
  for p in "${pids[@]}"; do [ "$p" = "$hostpid" ] || wait "$p" || true; done
  pids=(${hostpid:+"$hostpid"})
  local hostrc=0
  if [ -n "$hostpid" ]; then
    sleep "$linger"
    kill -TERM "$hostpid" 2>/dev/null || true
    wait "$hostpid" || hostrc=$?
    [ "$hostrc" = 143 ] && hostrc=0
    pids=()
  fi
  local t1; t1=$(date +%s.%N)
  local mach="pc"
  [ "$VIOMMU" = 1 ] && mach="q35 + intel-iommu (guests' vfio-pci)"
  echo "vm.sh: accel $accel, machine $mach, region ${mib} MiB, ${plain:+ivshmem-plain}${bell:+ivshmem-doorbell + vm-host}, wall $(python3 -c "print(f'{$t1-$t0:.1f}')") s"
  for r in a ${hasb:+b}; do
    echo "--- guest $r"
    local out=$d/out-$r
    if ! grep -q '=== SHMLINK-VM-BEGIN' "$out" 2>/dev/null; then
      echo "vm.sh: guest $r never reached its command (deadline ${timeout}s?); console:"
      tail -20 "$out" 2>/dev/null; cat "$d/qemu-$r.log"; rc=1; continue
    fi
    sed -n '/=== SHMLINK-VM-BEGIN/,/=== SHMLINK-VM-EXIT/p' "$out" | sed '1d;$d' | tr -d '\r'
    local grc; grc=$(sed -n 's/.*=== SHMLINK-VM-EXIT \([0-9]*\).*/\1/p' "$out" | tail -1)
    if [ -z "$grc" ]; then echo "vm.sh: guest $r did not finish its command by the deadline"; rc=1
    elif [ "$grc" != 0 ]; then echo "vm.sh: guest $r command exited $grc"; rc=1; fi
  done
  if [ -n "$host" ]; then
    echo "--- host"
    cat "$d/out-host"
    [ "$hostrc" = 0 ] || { echo "vm.sh: host command exited $hostrc"; rc=1; }
  fi
  if [ -n "$bellpid" ]; then
    kill -TERM "$bellpid" 2>/dev/null || true
    wait "$bellpid" 2>/dev/null || true
    bellpid=
    # Peers joining and leaving (QEMUs first: ids 0 and 1, then host processes).
    echo "--- vm-host"; cat "$d/vm-host.log"
  fi
  return $rc
}

case ${1:-} in
  install) cmd_install ;;
  image) cmd_image ;;
  accel) cmd_accel ;;
  viommu) cmd_viommu "$(cmd_accel)" ;;
  check) cmd_check ;;
  run) shift; cmd_run "$@" ;;
  *) sed -n '2,36p' "$0"; exit 2 ;;
esac
