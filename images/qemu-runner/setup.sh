#!/bin/sh
# setup.sh PHASE: one build phase of the `qemu-runner` image, run inside its chroot by ale_iac/images.py.
#
# Phases: packages | cleanup
set -eu
export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C.UTF-8
APT_GET="apt-get -y -o Dpkg::Use-Pty=0 -o APT::Install-Recommends=false -o APT::Install-Suggests=false"

case "${1:?usage: setup.sh packages|cleanup}" in
packages)
    cat >/etc/dpkg/dpkg.cfg.d/01-ale-nodoc <<'NODOC'
path-exclude=/usr/share/man/*
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
NODOC
    $APT_GET update
    # qemu-system-x86: the emulator (seabios and ipxe come with it); qemu-utils: qemu-img for the overlay
    $APT_GET install qemu-system-x86 qemu-utils
    mkdir -p /opt/ale-iac
    qemu-system-x86_64 --version
    ;;
cleanup)
    $APT_GET clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log /var/log/bootstrap.log
    : >/etc/resolv.conf
    ;;
*)
    echo "setup.sh: unknown phase '$1'" >&2
    exit 2
    ;;
esac
