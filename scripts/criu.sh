#!/usr/bin/env bash
# CRIU for checkpointed local pool units (docs/checkpoint.md), in a folder of ale-iac's own.
#
# Debian 12's criu 3.17 fails `criu check` on kernels from 6.13 (`vdso: Unexpected rt vDSO area bounds`), and
# 4.1 cannot dump a TCP socket on 6.16 and later (`sockets: Can't get 1:16 opt: Operation not supported`: the
# kernel now refuses SO_PASSCRED on one). 4.2 has both fixes; Debian has it in unstable only. So this script
# downloads unstable's `criu` and the libraries it links (the C library among them) with apt-get and a source
# list of its own (the host's apt configuration is not touched), unpacks them into
# ${ALE_IAC_CACHE:-~/.cache/ale-iac}/criu/<version>/root, and writes <version>/criu, which runs that criu through
# the folder's own dynamic loader with its own libraries, so nothing of the host's C library changes; criu/current
# points at <version>. ale-iac runs current/criu (ale_iac/substrates/local/checkpoint.py); without it, a `criu`
# of at least 4.2 on PATH.
#
#   scripts/criu.sh fetch   # idempotent: seconds when current/criu is there
#   scripts/criu.sh path    # prints the folder; nothing, and exit 1, when not fetched
set -euo pipefail

CACHE="${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ale-iac}"
DIR="$CACHE/criu"
SUITE="${ALE_IAC_CRIU_SUITE:-unstable}"
MIRROR="${ALE_IAC_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
log() { echo "[criu] $*" >&2; }

case "${1:-}" in
  path)
    if [[ -x "$DIR/current/criu" ]]; then readlink -f "$DIR/current"; exit 0; fi
    exit 1
    ;;
  fetch) ;;
  *) echo "usage: scripts/criu.sh fetch|path" >&2; exit 2 ;;
esac

if [[ -x "$DIR/current/criu" ]]; then
  log "present: $(readlink -f "$DIR/current")"
  exit 0
fi
mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/.fetch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/lists/partial" "$WORK/archives/partial" "$WORK/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $SUITE main" >"$WORK/sources.list"
APT=(-o "Dir::Etc::SourceList=$WORK/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$WORK/lists" -o "Dir::Cache=$WORK" -o "Dir::Cache::archives=$WORK/archives"
  -o APT::Sandbox::User=root -o Debug::NoLocking=1)
apt-get "${APT[@]}" -q update >"$WORK/update.log" 2>&1 || { tail -n 20 "$WORK/update.log" >&2; exit 1; }
VERSION=$(apt-cache "${APT[@]}" show criu | awk '/^Version:/ {print $2; exit}')
[[ -n "$VERSION" ]] || { log "Debian $SUITE has no criu package"; exit 1; }
# criu and what it depends on, recursively, as that suite has them (virtual packages left out).
mapfile -t PACKAGES < <(apt-cache "${APT[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances criu | grep -E '^[a-z0-9]' | sort -u)
(cd "$WORK/debs" && apt-get "${APT[@]}" -q download "${PACKAGES[@]}" >"$WORK/download.log" 2>&1) ||
  { tail -n 20 "$WORK/download.log" >&2; exit 1; }
TARGET="$DIR/$VERSION"
rm -rf "$TARGET.new"
mkdir -p "$TARGET.new/root"
for deb in "$WORK/debs"/*.deb; do dpkg-deb -x "$deb" "$TARGET.new/root"; done
# The wrapper names the folder's final place; it is tried from there once moved, before current/ points at it.
ROOT="$TARGET/root"
cat >"$TARGET.new/criu" <<WRAPPER
#!/bin/sh
# CRIU $VERSION from Debian $SUITE, run with its own loader and libraries (scripts/criu.sh).
exec "$ROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \\
  --library-path "$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu" "$ROOT/usr/sbin/criu" "\$@"
WRAPPER
chmod 0755 "$TARGET.new/criu"
rm -rf "$TARGET"
mv "$TARGET.new" "$TARGET"
if ! "$TARGET/criu" --version >"$WORK/version.txt" 2>&1; then
  cat "$WORK/version.txt" >&2
  log "the unpacked criu $VERSION does not run"
  exit 1
fi
ln -sfn "$VERSION" "$DIR/current.new"
mv -T "$DIR/current.new" "$DIR/current"
log "criu $VERSION from Debian $SUITE in $TARGET/root ($(head -n 1 "$WORK/version.txt"))"
