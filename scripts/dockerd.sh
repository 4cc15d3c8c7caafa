#!/usr/bin/env bash
# ale-iac's own Docker engine: the engine every ale-iac container runs in (docker units, the docker executor, the
# qemu runner). Its own daemon configuration, data root, exec root, pid file and socket, so that a user's own
# engine (the default socket, /var/lib/docker) is never started, stopped or reconfigured by ale-iac:
#   * socket    ${ALE_IAC_DOCKER_SOCKET:-/run/ale-iac/docker.sock} (the client side: ale_iac/substrates/docker/runtime.py)
#   * data root ${ALE_IAC_DOCKER_DATA_ROOT:-/var/lib/ale-iac/docker}, exec root /run/ale-iac/docker
#   * config, log and pid file in ${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/ale-iac}/engine/
#   * userns-remap: root in a container is an unprivileged host uid range (the `dockremap` user's /etc/subuid
#     range, which the engine adds on its first start); containers that need the host's namespaces opt out
#     one by one (--userns=host). No default bridge (every unit has a network of its own), icc off,
#     no-new-privileges by default.
# Idempotent, as root: if the engine answers on its socket nothing is started; else `dockerd` is started in the
# background (no systemd on these hosts) and the API polled until it answers.
# `scripts/dockerd.sh stop` stops the dockerd this script started (by the pid it recorded) and nothing else.
# `scripts/dockerd.sh socket` prints the socket. scripts/setup.sh installs the engine (Debian's docker.io).
set -euo pipefail

CACHE="${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ale-iac}"
DIR="$CACHE/engine"
PIDFILE="$DIR/dockerd.pid"
LOG="$DIR/dockerd.log"
CONFIG="$DIR/daemon.json"
SOCKET="${ALE_IAC_DOCKER_SOCKET:-/run/ale-iac/docker.sock}"
DATA_ROOT="${ALE_IAC_DOCKER_DATA_ROOT:-/var/lib/ale-iac/docker}"
EXEC_ROOT="$(dirname "$SOCKET")/docker"
READY_TIMEOUT_S="${ALE_IAC_DOCKERD_TIMEOUT:-60}"

log() { echo "[dockerd] $*" >&2; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
engine_up() { docker -H "unix://$SOCKET" info --format '{{.ServerVersion}}' >/dev/null 2>&1; }
ours() { [[ -s "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

if [[ "${1:-}" == "socket" ]]; then echo "$SOCKET"; exit 0; fi
mkdir -p "$DIR"

if [[ "${1:-}" == "stop" ]]; then
  if ! ours; then log "no dockerd started by this script is running"; exit 0; fi
  pid=$(cat "$PIDFILE")
  kill -TERM "$pid"
  # dockerd stops its containers and containerd first; wait for exactly this pid to go.
  for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "dockerd $pid did not stop in 60 s; killing it"; kill -KILL "$pid"; fi
  log "stopped dockerd $pid"
  exit 0
fi

# One start at a time (parallel test workers call this too). fd 9 is closed for dockerd, so the lock does
# not live on in the daemon.
exec 9>"$DIR/lock"
flock 9

if engine_up; then exit 0; fi
if ! command -v dockerd >/dev/null; then
  log "dockerd is not installed; run scripts/setup.sh (it installs Debian's docker.io)"; exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  log "ale-iac's Docker engine is not running and starting it needs root"; exit 1
fi
if ours; then
  log "dockerd $(cat "$PIDFILE") is running but does not answer on $SOCKET; see $LOG"; exit 1
fi

mkdir -p "$(dirname "$SOCKET")" "$DATA_ROOT"
chmod 0711 "$(dirname "$DATA_ROOT")"
cat >"$CONFIG" <<JSON
{
  "hosts": ["unix://$SOCKET"],
  "data-root": "$DATA_ROOT",
  "exec-root": "$EXEC_ROOT",
  "pidfile": "$PIDFILE",
  "userns-remap": "default",
  "bridge": "none",
  "icc": false,
  "no-new-privileges": true,
  "storage-driver": "overlay2",
  "log-driver": "json-file",
  "log-opts": {"max-size": "10m", "max-file": "2"}
}
JSON
T0=$(date +%s%N)
echo "=== $(date -u +%FT%TZ) starting dockerd --config-file $CONFIG" >>"$LOG"
setsid dockerd --config-file "$CONFIG" </dev/null >>"$LOG" 2>&1 9>&- &
pid=$!
deadline=$(( $(date +%s) + READY_TIMEOUT_S ))
until engine_up; do
  if ! kill -0 "$pid" 2>/dev/null; then
    log "dockerd exited before it answered; last lines of $LOG:"; tail -n 20 "$LOG" >&2; exit 1
  fi
  if (( $(date +%s) >= deadline )); then
    log "dockerd $pid did not answer within ${READY_TIMEOUT_S} s; last lines of $LOG:"; tail -n 20 "$LOG" >&2
    exit 1
  fi
  sleep 0.1  # poll interval, not a readiness guess: the loop ends when the API answers
done
log "dockerd $pid ready in $(ms_since "$T0") ms on $SOCKET (log: $LOG)"
