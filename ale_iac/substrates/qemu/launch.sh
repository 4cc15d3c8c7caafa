#!/bin/sh
# launch.sh: start one ale-iac QEMU guest in the foreground (this shell execs qemu-system-x86_64).
#
# The one launch script of the qemu substrate: the host runner runs it directly, the runner container
# (images/qemu-runner) runs it as its command; both with the same arguments, as root. UNIT_DIR is the
# unit's own folder (root's, 0700); QEMU gets UNIT_DIR/vm, a folder owned by the unprivileged host id
# --uid (uid and gid alike, no supplementary group), and nothing else: this script makes it with the
# disposable overlay (vm/disk.qcow2, on the read-only BASE) and the guest share (vm/share), opens the
# kernel, the initrd, the base and the rest of its backing chain (--backing, in chain order) and the
# saved memory state read-only, then execs QEMU as --uid with no capability (bounding set empty too),
# no_new_privs, and its working folder vm/. QEMU names every file relative to vm/ or as one of those
# open descriptors (/proc/self/fd/N, which needs no search permission on the folders above), so that
# the unit's own folder, the image cache and the rest of the host stay out of its reach.
# The guest gets user-mode networking with restrict=on (no outbound) and one port forward, host
# 127.0.0.1:PORT -> guest 8443 (the authenticating forwarder); QMP on vm/qmp.sock; its agent channel on
# vm/agent.sock; the guest share vm/share (9p, tag aleshare).
# With --incoming STATE the guest is restored from a saved memory state (read from an open descriptor:
# QEMU spawns nothing). QEMU's own seccomp filter (-sandbox) denies it obsolete system calls,
# setuid/setgid, spawning processes and scheduler or resource changes.
#
#   launch.sh --unit-dir D --base B [--backing B2 ...] --kernel K --initrd I --port P --uid U
#             --vcpus N --memory-mb M --accel tcg|kvm [--width W --height H] [--incoming STATE]
set -eu
umask 077 # the overlay, logs, sockets and share are the unit's alone
unit_dir= base= kernel= initrd= port= uid= vcpus=1 memory_mb=2048 accel=tcg width=1280 height=800 incoming=
backing_fds= next_fd=6
while [ $# -gt 0 ]; do
    case "$1" in
    --unit-dir) unit_dir=$2 ;;
    --base) base=$2 ;;
    --backing) # one more layer of the base's chain, opened here (fds 6, 7, ...)
        eval "exec $next_fd<\"\$2\""
        backing_fds="$backing_fds $next_fd" next_fd=$((next_fd + 1)) ;;
    --kernel) kernel=$2 ;;
    --initrd) initrd=$2 ;;
    --port) port=$2 ;;
    --uid) uid=$2 ;;
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
for name in unit_dir base kernel initrd port uid; do
    eval "value=\${$name}"
    [ -n "$value" ] || { echo "launch.sh: --$(echo $name | tr _ -) is required" >&2; exit 2; }
done
case "$accel" in tcg | kvm) ;; *) echo "launch.sh: --accel must be tcg or kvm" >&2; exit 2 ;; esac
case "$uid" in 0 | *[!0-9]*) echo "launch.sh: --uid must be a number other than 0" >&2; exit 2 ;; esac

vm="$unit_dir/vm"
mkdir -p "$vm/share"
[ -e "$vm/disk.qcow2" ] || qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$vm/disk.qcow2"
chown "$uid:$uid" "$vm" "$vm/share" "$vm/disk.qcow2"
# The sockets are named relative to vm/: a unix socket path has at most 107 bytes, which a deep
# ALE_IAC_HOME would exceed (the host connects through /proc/self/fd/N/NAME for the same reason).
cd "$vm"
exec 3<"$kernel" 4<"$initrd" 5<"$base"
# The overlay's backing chain, each layer through its open descriptor instead of the path in its header.
drive="file=disk.qcow2,if=virtio,format=qcow2,discard=unmap,backing.file.filename=/proc/self/fd/5"
prefix=backing.backing.
for fd in $backing_fds; do
    drive="$drive,${prefix}file.filename=/proc/self/fd/$fd" prefix="${prefix}backing."
done
# The unit folder in QEMU's name (a comma doubled): how the host tells this unit's QEMU from others.
name="guest=ale:$(printf %s "$unit_dir" | sed 's/,/,,/g'),process=ale-qemu"

set -- -name "$name" -accel "$accel" -m "$memory_mb" -smp "$vcpus" \
    -nodefaults -no-user-config -display none -no-reboot \
    -serial file:serial.log \
    -kernel /proc/self/fd/3 -initrd /proc/self/fd/4 \
    -append "root=LABEL=alegroot rw console=ttyS0 net.ifnames=0 panic=-1 quiet init=/usr/local/sbin/ale-guest-init ale.width=$width ale.height=$height" \
    -drive "$drive" \
    -netdev "user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$port-:8443" -device virtio-net-pci,netdev=n0 \
    -qmp "unix:qmp.sock,server=on,wait=off" \
    -chardev "socket,id=agent,path=agent.sock,server=on,wait=off" \
    -device virtio-serial-pci -device virtserialport,chardev=agent,name=ale.agent \
    -fsdev "local,id=share,path=share,security_model=mapped-xattr" \
    -device virtio-9p-pci,fsdev=share,mount_tag=aleshare \
    -device virtio-rng-pci -device vmgenid,guid=auto \
    -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny
groups=--clear-groups
# Under TCG, QEMU's default CPU model (qemu64) lacks what today's binaries are built for (SSE4.2, AVX2, BMI2:
# Claude Code's native binary dies of SIGILL on it); `max` offers every feature TCG emulates, as a cloud VM's
# CPU would. The model is part of the saved state, which this script's hash keys (saved.py).
if [ "$accel" = kvm ]; then
    set -- "$@" -cpu host
    kvm_gid=$(stat -c %g /dev/kvm) # /dev/kvm through its group, which must have rw on it (never root's)
    [ "$kvm_gid" != 0 ] || { echo "launch.sh: /dev/kvm belongs to group 0: give it a kvm group" >&2; exit 2; }
    groups="--groups=$kvm_gid"
else
    set -- "$@" -cpu max
fi
if [ -n "$incoming" ]; then
    exec 9<"$incoming"
    set -- "$@" -incoming fd:9
fi
exec setpriv --reuid="$uid" --regid="$uid" "$groups" --inh-caps=-all --bounding-set=-all --no-new-privs \
    -- qemu-system-x86_64 "$@"
