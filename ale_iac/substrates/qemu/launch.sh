#!/bin/sh
# launch.sh: start one ale-iac QEMU guest in the foreground (this shell execs qemu-system-x86_64).
#
# The one launch script of the qemu substrate: the host runner runs it directly, the runner container
# (images/qemu-runner) runs it as its command; both with the same arguments. UNIT_DIR is the unit's
# own folder; this script makes its disposable overlay (UNIT_DIR/disk.qcow2) on the read-only BASE if
# it is not there yet. The guest gets user-mode networking with restrict=on (no outbound) and one port
# forward, host 127.0.0.1:PORT -> guest 8443 (the authenticating forwarder); QMP on UNIT_DIR/qmp.sock;
# its agent channel on UNIT_DIR/agent.sock; the guest share UNIT_DIR/share (9p, tag aleshare).
# With --incoming STATE the guest is restored from a saved memory state instead of booting.
# QEMU's own seccomp filter (-sandbox) denies it obsolete system calls, setuid/setgid and scheduler or
# resource changes; spawning stays allowed, since saving and loading a memory state run `cat`.
#
#   launch.sh --unit-dir D --base B --kernel K --initrd I --port P --vcpus N --memory-mb M
#             --accel tcg|kvm [--width W --height H] [--incoming STATE]
set -eu
umask 077 # the overlay, logs, sockets and share are the unit's, readable by root only
unit_dir= base= kernel= initrd= port= vcpus=1 memory_mb=2048 accel=tcg width=1280 height=800 incoming=
while [ $# -gt 0 ]; do
    case "$1" in
    --unit-dir) unit_dir=$2 ;;
    --base) base=$2 ;;
    --kernel) kernel=$2 ;;
    --initrd) initrd=$2 ;;
    --port) port=$2 ;;
    --vcpus) vcpus=$2 ;;
    --memory-mb) memory_mb=$2 ;;
    --accel) accel=$2 ;;
    --width) width=$2 ;;
    --height) height=$2 ;;
    --incoming) incoming=$2 ;;
    *) echo "launch.sh: unknown argument $1" >&2; exit 2 ;;
    esac
    shift 2
done
for name in unit_dir base kernel initrd port; do
    eval "value=\${$name}"
    [ -n "$value" ] || { echo "launch.sh: --$(echo $name | tr _ -) is required" >&2; exit 2; }
done
case "$accel" in tcg | kvm) ;; *) echo "launch.sh: --accel must be tcg or kvm" >&2; exit 2 ;; esac

mkdir -p "$unit_dir/share"
# The sockets are named relative to the unit folder: a unix socket path has at most 107 bytes, which a
# deep ALE_IAC_HOME would exceed (the host connects through /proc/self/fd/N/NAME for the same reason).
cd "$unit_dir"
[ -e "$unit_dir/disk.qcow2" ] || qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$unit_dir/disk.qcow2"

set -- -name "ale-guest,process=ale-qemu" -accel "$accel" -m "$memory_mb" -smp "$vcpus" \
    -nodefaults -no-user-config -display none -no-reboot \
    -serial "file:$unit_dir/serial.log" \
    -kernel "$kernel" -initrd "$initrd" \
    -append "root=LABEL=alegroot rw console=ttyS0 net.ifnames=0 panic=-1 quiet init=/usr/local/sbin/ale-guest-init ale.width=$width ale.height=$height" \
    -drive "file=$unit_dir/disk.qcow2,if=virtio,format=qcow2,discard=unmap" \
    -netdev "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$port-:8443" -device virtio-net-pci,netdev=n0 \
    -qmp "unix:qmp.sock,server=on,wait=off" \
    -chardev "socket,id=agent,path=agent.sock,server=on,wait=off" \
    -device virtio-serial-pci -device virtserialport,chardev=agent,name=ale.agent \
    -fsdev "local,id=share,path=$unit_dir/share,security_model=mapped-xattr" \
    -device virtio-9p-pci,fsdev=share,mount_tag=aleshare \
    -device virtio-rng-pci -device vmgenid,guid=auto \
    -sandbox on,obsolete=deny,elevateprivileges=deny,resourcecontrol=deny
[ "$accel" = kvm ] && set -- "$@" -cpu host
[ -n "$incoming" ] && set -- "$@" -incoming "exec:cat '$incoming'"
exec qemu-system-x86_64 "$@"
