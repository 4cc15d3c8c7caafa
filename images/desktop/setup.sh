#!/bin/sh
# setup.sh PHASE: one build phase of the `desktop` image, run inside the image's chroot by
# ale_iac/images.py (which copies this folder to /tmp/ale-recipe and times each phase).
#
# Phases: packages | server | configure | cleanup
# Environment from the builder: ALE_SUITE, ALE_MIRROR, ALE_SECURITY_MIRROR.
set -eu

RECIPE=/tmp/ale-recipe
export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C.UTF-8
APT_GET="apt-get -y -o Dpkg::Use-Pty=0 -o APT::Install-Recommends=false -o APT::Install-Suggests=false"

# Non-comment, non-empty lines of a package list, space separated.
list() { sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$1" | tr '\n' ' '; }

case "${1:?usage: setup.sh packages|server|configure|cleanup}" in
packages)
    rm -f /etc/apt/sources.list
    cat >/etc/apt/sources.list.d/debian.sources <<EOF
Types: deb
URIs: ${ALE_MIRROR}
Suites: ${ALE_SUITE} ${ALE_SUITE}-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${ALE_SECURITY_MIRROR}
Suites: ${ALE_SUITE}-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # Keep the image small: no man pages, docs or translations.
    cat >/etc/dpkg/dpkg.cfg.d/01-ale-nodoc <<'EOF'
path-exclude=/usr/share/man/*
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
EOF
    $APT_GET update
    $APT_GET upgrade
    # shellcheck disable=SC2046
    $APT_GET install $(list "$RECIPE/packages.txt")
    ;;
server)
    # shellcheck disable=SC2046
    $APT_GET install $(list "$RECIPE/build-packages.txt")
    python3 -m venv /opt/cua
    /opt/cua/bin/pip install --no-cache-dir --disable-pip-version-check -r "$RECIPE/requirements.txt"
    # uvicorn[standard] brings uvloop, and uvicorn.run() picks it when present. Under uvloop the
    # children of run_command inherit the reply's socketpair (seen: fds 21 and 23 of a `sleep &`),
    # so a command that starts a background program (`xterm &`) would not return until it exits.
    # Without uvloop uvicorn uses asyncio's own loop, which closes them.
    /opt/cua/bin/pip uninstall -y --disable-pip-version-check uvloop
    # fastmcp serves only the server's own MCP endpoint (/mcp), which ale-iac never uses (its bridges speak
    # MCP, over /cmd). The server imports it in a try/except ImportError and runs without /mcp when it is
    # missing; its import was 0.9 of the 1.6 CPU-seconds every sandbox's server spent starting (measured with
    # `python -X importtime -c 'import computer_server.main'` in this rootfs). The `mcp` package it pulled in
    # stays installed but is never imported.
    /opt/cua/bin/pip uninstall -y --disable-pip-version-check fastmcp
    # Also drop what only the compiler pulled in; binutils would otherwise stay, as python3.13
    # recommends it.
    # shellcheck disable=SC2046
    $APT_GET -o APT::AutoRemove::RecommendsImportant=false -o APT::AutoRemove::SuggestsImportant=false \
        purge --autoremove $(list "$RECIPE/build-packages.txt")
    # Byte-compile now: the rootfs is read-only at run time, and a sandbox should not spend its
    # start writing .pyc files into its own writable layer.
    /opt/cua/bin/python -m compileall -q -j 0 /opt/cua/lib >/dev/null || true
    /opt/cua/bin/python -c 'import importlib.metadata as m; print("computer-server", m.version("cua-computer-server"))'
    # Kept out (a new requirements.txt could bring it back through cua-computer-server).
    /opt/cua/bin/python -c 'import importlib.util as u; assert u.find_spec("fastmcp") is None, "fastmcp is back"'
    ;;
configure)
    install -m 0755 "$RECIPE/ale-init" /usr/local/sbin/ale-init
    install -D -m 0644 "$RECIPE/Xresources" /etc/ale/Xresources
    # Path conventions (ale_iac.profile.LINUX_DESKTOP_PATHS): home, work_dir_base, task_data_root.
    mkdir -p /root/.ale /data/tasks /var/log/ale
    chmod 0700 /root
    printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >/etc/hosts
    echo sandbox >/etc/hostname
    test -x /usr/bin/python3
    ;;
cleanup)
    $APT_GET clean
    rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/debconf/*-old /var/lib/dpkg/*-old
    rm -rf /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/log/bootstrap.log
    rm -rf /root/.cache /tmp/* /tmp/.[!.]* 2>/dev/null || true
    # Font caches last, once every package's triggers have run: xfonts-utils rewrites fonts.dir of
    # /usr/share/fonts/X11/{misc,Type1} after fontconfig's trigger cached them, which left those two caches
    # stale, and every sandbox rescanned both folders when its desktop started (openbox: 0.26 CPU-s of a
    # start, 0.02 with the caches current; tests/substrates/local/test_runtime.py checks none is rebuilt).
    # The font folders' times are cut to whole seconds first: a cache holds its folder's mtime to the
    # nanosecond, and an export as a tar layer (a docker image, a cluster's OCI archive) keeps whole seconds,
    # so in a container every cache was stale and each fontconfig client rescanned every font (openbox: 0.44
    # CPU-s of a docker unit's start; tests/substrates/docker/test_runtime.py checks none is rebuilt there).
    # -L: fontconfig follows the links to folders (poppler's cMap folders) and caches what they lead to.
    for fonts in /usr/share/fonts /usr/local/share/fonts; do
        [ -d "$fonts" ] || continue
        find -L "$fonts" -xdev -type d -exec sh -c 'for d; do touch -m -d "@$(stat -c %Y "$d")" "$d"; done' sh {} +
    done
    fc-cache
    # The sandbox runtime writes its own resolv.conf when a sandbox may go outbound.
    : >/etc/resolv.conf
    ;;
*)
    echo "setup.sh: unknown phase '$1'" >&2
    exit 2
    ;;
esac
