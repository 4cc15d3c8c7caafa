#!/bin/sh
# export.sh LOWER WORK OUT GUEST_DIR PROXY DISK_GB: the qcow2 export of a built image rootfs.
#
# Run by ale_iac/substrates/qemu/disk.py inside a private mount namespace (unshare --mount), so that
# the overlay and the chroot's /proc and /dev vanish with it whatever happens. The image's rootfs
# (LOWER) is never written: an overlay puts Debian's kernel and initramfs-tools (MODULES=most: the
# virtio_blk, virtio_net, 9p and ext4 modules), the guest init and agent, and the endpoint's forwarder
# on top; the merged tree becomes an ext4 file system (mkfs.ext4 -d), converted to qcow2 by the caller.
# The environment (mirror, proxies, CA bundle) is the image builder's.
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
    $apt_get install linux-image-amd64 initramfs-tools kmod
    $apt_get clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log /tmp/ale-build-ca.pem
'
umount -l "$merged/dev"
umount "$merged/proc"
rm -f "$merged/etc/apt/apt.conf.d/99ale-build"
: >"$merged/etc/resolv.conf"
: >"$merged/etc/machine-id"
install -m 0755 "$guest/ale-guest-init" "$merged/usr/local/sbin/ale-guest-init"
install -m 0755 "$guest/ale-guest-agent" "$merged/usr/local/sbin/ale-guest-agent"
install -D -m 0600 "$proxy" "$merged/opt/ale-iac/authproxy.py"
printf 'LABEL=alegroot / ext4 rw,noatime 0 1\n' >"$merged/etc/fstab"
mkdir -p "$merged/mnt/ale-share"
cp "$(ls -1 "$merged"/boot/vmlinuz-* | tail -n 1)" "$out/vmlinuz"
cp "$(ls -1 "$merged"/boot/initrd.img-* | tail -n 1)" "$out/initrd.img"
truncate -s "${disk_gb}G" "$out/disk.raw"
mkfs.ext4 -q -F -L alegroot -E root_owner=0:0 -d "$merged" "$out/disk.raw"
umount "$merged"
