#!/usr/bin/env bash
# The Docker engine the `docker` executor runs agents in (ale_iac/executors/docker.py). Idempotent, as root:
#   * if the engine answers (`docker info`), nothing is started;
#   * else `dockerd` is started in the background (no systemd on these hosts), its log and pid file in
#     ${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/ale-iac}/dockerd/, and the API is polled until it answers;
#   * either way, containers on the default bridge get no egress (a DOCKER-USER rule; ale-iac's own containers
#     run with --network none anyway).
# `scripts/dockerd.sh stop` stops the dockerd this script started (by the pid it recorded) and nothing else.
# scripts/setup.sh installs the engine (Debian's docker.io); .ci/run calls this before the tests.
set -euo pipefail

CACHE="${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ale-iac}"
DIR="$CACHE/dockerd"
PIDFILE="$DIR/dockerd.pid"
LOG="$DIR/dockerd.log"
READY_TIMEOUT_S="${ALE_IAC_DOCKERD_TIMEOUT:-60}"
mkdir -p "$DIR"

log() { echo "[dockerd] $*" >&2; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
engine_up() { docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; }
ours() { [[ -s "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

block_egress() {
  # Only when the engine manages iptables (the chain exists); -C first, so a rerun adds no duplicate.
  command -v iptables >/dev/null || return 0
  iptables -n -L DOCKER-USER >/dev/null 2>&1 || return 0
  if ! iptables -C DOCKER-USER -i docker0 ! -o docker0 -j DROP 2>/dev/null; then
    iptables -I DOCKER-USER -i docker0 ! -o docker0 -j DROP
    log "blocked container egress on docker0 (DOCKER-USER)"
  fi
}

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

if engine_up; then
  block_egress
  exit 0
fi
if ! command -v dockerd >/dev/null; then
  log "dockerd is not installed; run scripts/setup.sh (it installs Debian's docker.io)"; exit 1
fi
if [[ $(id -u) -ne 0 ]]; then
  log "the Docker engine is not running and starting it needs root"; exit 1
fi
if ours; then
  log "dockerd $(cat "$PIDFILE") is running but does not answer; see $LOG"; exit 1
fi

T0=$(date +%s%N)
echo "=== $(date -u +%FT%TZ) starting dockerd" >>"$LOG"
setsid dockerd --pidfile "$PIDFILE" </dev/null >>"$LOG" 2>&1 9>&- &
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
block_egress
log "dockerd $pid ready in $(ms_since "$T0") ms (log: $LOG)"
