#!/bin/sh
# cloud-export.sh LOWER WORK OUT GUEST_DIR PROXY DISK_GB: the cloud disk of a built image rootfs, OUT/disk.raw.
#
# Run by ale_iac/substrates/qemu/cloud.py inside a private mount namespace (unshare --mount), like export.sh
# for the qcow2 export, whose guest it shares: the same image rootfs (never written: an overlay on top), the
# same guest init and agent, the same forwarder. What a cloud needs beyond QEMU's direct kernel boot:
#   - a boot loader: an MBR with one bootable partition at 1 MiB (ext4, label alegroot); GRUB's boot sector
#     in the MBR and its core image in the gap before the partition (grub-mkimage fills in the core image's
#     own length, the boot sector's default points at sector 1: no grub-install, no loop device);
#   - a DHCP client (dhcpcd) for whatever NIC the cloud gives, and kernel modules for its devices
#     (initramfs MODULES=most: virtio-scsi, virtio-blk, NVMe; the modules of the rest are on the disk);
#   - `ale.identity=metadata` on the kernel command line: the guest agent takes the unit's token from the
#     cloud's instance metadata service (ale-guest-agent).
# The serial console is ttyS0 (GCE's, EC2's and ECS's serial port).
set -eu
lower=$1 work=$2 out=$3 guest=$4 proxy=$5 disk_gb=$6
merged="$work/merged"
mkdir -p "$work/upper" "$work/ovl" "$merged" "$out"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/ovl" "$merged"
cp /etc/resolv.conf "$merged/etc/resolv.conf"
if [ -n "${ALE_APT_CONF:-}" ]; then printf '%s' "$ALE_APT_CONF" >"$merged/etc/apt/apt.conf.d/99ale-build"; fi
if [ -n "${ALE_CA_BUNDLE:-}" ]; then cp "$ALE_CA_BUNDLE" "$merged/tmp/ale-build-ca.pem"; fi
mount -t proc proc "$merged/proc"
mount --rbind /dev "$merged/dev"
DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 chroot "$merged" /bin/sh -ec '
    apt_get="apt-get -y -o Dpkg::Use-Pty=0 -o APT::Install-Recommends=false -o APT::Install-Suggests=false"
    $apt_get update
    $apt_get install linux-image-amd64 initramfs-tools kmod grub-pc-bin dhcpcd-base fdisk
    $apt_get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log /tmp/ale-build-ca.pem
'
rm -f "$merged/etc/apt/apt.conf.d/99ale-build"
: >"$merged/etc/resolv.conf"
: >"$merged/etc/machine-id"
install -m 0755 "$guest/ale-guest-init" "$merged/usr/local/sbin/ale-guest-init"
install -m 0755 "$guest/ale-guest-agent" "$merged/usr/local/sbin/ale-guest-agent"
install -D -m 0600 "$proxy" "$merged/opt/ale-iac/authproxy.py"
printf 'LABEL=alegroot / ext4 rw,noatime 0 1\n' >"$merged/etc/fstab"
mkdir -p "$merged/mnt/ale-share"

kernel=$(ls -1 "$merged"/boot/vmlinuz-* | tail -n 1)
version=${kernel##*/vmlinuz-}
mkdir -p "$merged/boot/grub/i386-pc"
cp "$merged"/usr/lib/grub/i386-pc/*.mod "$merged"/usr/lib/grub/i386-pc/*.lst "$merged/boot/grub/i386-pc/"
cat >"$merged/boot/grub/grub.cfg" <<GRUB_EOF
serial --unit=0 --speed=115200
terminal_input console serial
terminal_output console serial
set timeout=0
linux /boot/vmlinuz-$version root=LABEL=alegroot rw console=tty0 console=ttyS0,115200 net.ifnames=0 panic=10 quiet init=/usr/local/sbin/ale-guest-init ale.identity=metadata
initrd /boot/initrd.img-$version
boot
GRUB_EOF

truncate -s "${disk_gb}G" "$out/disk.raw"
mkdir -p "$merged/mnt/ale-out"
mount --bind "$out" "$merged/mnt/ale-out"
printf 'label: dos\nstart=2048, type=83, bootable\n' | chroot "$merged" sfdisk -q /mnt/ale-out/disk.raw
chroot "$merged" grub-mkimage -O i386-pc -o /mnt/ale-out/core.img -p '(hd0,msdos1)/boot/grub' \
    biosdisk part_msdos ext2 normal linux serial terminal echo
umount "$merged/mnt/ale-out"
rmdir "$merged/mnt/ale-out"
umount -l "$merged/dev"
umount "$merged/proc"
core_sectors=$(( ($(stat -c %s "$out/core.img") + 511) / 512 ))
[ "$core_sectors" -lt 2047 ] || { echo "cloud-export.sh: GRUB's core image ($core_sectors sectors) does not fit before the partition" >&2; exit 1; }
dd if="$merged/usr/lib/grub/i386-pc/boot.img" of="$out/disk.raw" bs=440 count=1 conv=notrunc status=none
dd if="$out/core.img" of="$out/disk.raw" bs=512 seek=1 conv=notrunc status=none
rm "$out/core.img"
mkfs.ext4 -q -F -L alegroot -E offset=1048576,root_owner=0:0 -d "$merged" "$out/disk.raw" "$((disk_gb * 1024 * 1024 - 1024))k"
umount "$merged"
