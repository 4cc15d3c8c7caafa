#!/usr/bin/env bash
# One-time (and idempotent) setup of everything ale-iac needs on a Debian host, as root:
#   1. Debian packages listed in scripts/apt-packages.txt (and apt-packages-tests.txt unless --for demo), and the Docker engine (Debian's docker.io) when no
#      `dockerd` is installed (scripts/dockerd.sh starts it)
#   2. the Python venv (.venv) with ale-iac and its dev tools
#   3. the Pulumi toolchain (scripts/build-pulumi.sh: an existing CLI that is new enough, else the pinned one
#      built and cached; both versions are in versions.env)
#   4. the `desktop` image (rootfs cached by recipe hash)
# Every step is skipped when its result is already there, so a rerun takes seconds.
#
# `setup.sh --for demo` (scripts/demo.sh) sets up only what the demo (`local` profile) needs: no Docker engine.
# `setup.sh --for tests` (scripts/test.sh, the default) also installs the Docker engine. Neither makes the qemu
# artifacts (the desktop image's qcow2 export, the `qemu-runner` image): whatever first needs them makes them,
# once, with the same progress lines (`ale-iac evaluate` on a qemu profile, the qemu tests' fixtures,
# `ale-iac images build desktop --export qcow2`).
set -euo pipefail

FOR=tests
while (($#)); do
  case "$1" in
    --for) FOR="${2:-}"; shift 2 || { echo "[setup] --for needs a value: demo or tests" >&2; exit 2; } ;;
    --for=*) FOR="${1#--for=}"; shift ;;
    *) echo "[setup] unknown argument '$1' (usage: setup.sh [--for demo|tests])" >&2; exit 2 ;;
  esac
done
case "$FOR" in
  demo|tests) ;;
  *) echo "[setup] --for '$FOR': expected demo or tests" >&2; exit 2 ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PYTHON="${ALE_IAC_PYTHON:-python3}"
T0=$(date +%s)

step() { printf '[setup] %-40s ' "$1" >&2; STEP_T=$(date +%s%N); }
# quiet CMD...: run CMD with its output in a temporary log, shown only when it fails (so the step lines stay
# readable: apt's debconf notes and pip's build warnings are noise when all goes well).
quiet() {
  local out code=0; out=$(mktemp)
  "$@" >"$out" 2>&1 || code=$?
  if ((code == 0)); then rm -f "$out"; return 0; fi
  echo >&2; echo "[setup] failed (exit $code): $*" >&2; tail -n 40 "$out" >&2; rm -f "$out"
  return "$code"
}
# apt-get waits for another package manager's lock (a second setup, unattended-upgrades) instead of failing at once.
APT=(apt-get -o DPkg::Lock::Timeout=600)
done_step() {
  local ms=$(( ($(date +%s%N) - STEP_T) / 1000000 ))
  printf '%s (%d.%01d s)\n' "${1:-done}" $((ms / 1000)) $((ms % 1000 / 100)) >&2
}

# -- 1. Debian packages ------------------------------------------------------------------------
step "Debian packages"
LISTS=(scripts/apt-packages.txt)
[[ "$FOR" == demo ]] || LISTS+=(scripts/apt-packages-tests.txt)
mapfile -t PKGS < <(sed -e 's/#.*//' -e '/^\s*$/d' "${LISTS[@]}" | tr -s ' \t' '\n' | sed '/^$/d')
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo >&2; echo "[setup] missing Debian packages: ${missing[*]} (run as root, or install them)" >&2; exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  quiet "${APT[@]}" update -qq
  quiet "${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}"
  done_step "installed ${#missing[@]}"
else
  done_step "present"
fi

# The Docker engine for the `docker` executor: Debian's docker.io (with containerd, runc, iptables), only when
# no dockerd is installed at all: a host with Docker's own docker-ce keeps it (the two packages conflict).
step "Docker engine (dockerd)"
if [[ "$FOR" == demo ]]; then
  done_step "not needed for the demo"
elif command -v dockerd >/dev/null; then
  done_step "present"
elif [[ $(id -u) -ne 0 ]]; then
  echo >&2; echo "[setup] the Docker engine is missing: run as root, or apt-get install docker.io" >&2; exit 1
else
  export DEBIAN_FRONTEND=noninteractive
  quiet "${APT[@]}" update -qq
  quiet "${APT[@]}" install -y -qq --no-install-recommends docker.io
  done_step "installed docker.io"
fi

# -- 2. venv -----------------------------------------------------------------------------------
step "Python venv (.venv)"
stamp="$VENV/.ale-iac-installed"
want=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  done_step "up to date"
else
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  quiet "$VENV/bin/pip" install -q --upgrade pip
  # Byte-compile on install: PYTHONDONTWRITEBYTECODE is set on these machines, and without .pyc
  # files every process pays seconds to import the cloud SDKs again.
  quiet "$VENV/bin/pip" install -q --compile -e ".[dev]"
  echo "$want" > "$stamp"
  done_step "installed"
fi

# -- 3. Pulumi toolchain -----------------------------------------------------------------------
step "Pulumi toolchain"
echo >&2
# The Python language host stand-in (ale_iac/langhost.py, see build-pulumi.sh) runs on the venv, which has
# pulumi + grpc and ale-iac itself.
BIN_DIR=$(ALE_IAC_LANGUAGE_HOST_PYTHON="$VENV/bin/python" bash scripts/build-pulumi.sh)
for tool in "$BIN_DIR"/pulumi*; do ln -sf "$tool" "$VENV/bin/$(basename "$tool")"; done
step "Pulumi toolchain linked into .venv/bin"; done_step "$BIN_DIR"

# -- 3b. the Kubernetes cluster and provider plugin (scripts/kube-cluster.sh) --------------------------
# Built on first need, not here: by the kubernetes tests' fixture (tests/support/kube.py) or `ale-iac evaluate` on
# a profile with a kubernetes route (provision.ensure_kube_plugin), ~25 min cold on 2 cores; a cached build is
# reused in well under a second. This step only says which it will be.
step "Kubernetes cluster + provider plugin"
if [[ "$FOR" == demo ]]; then
  done_step "not needed for the demo"
elif KUBE_BIN=$(bash scripts/kube-cluster.sh build --check 2>/dev/null); then
  done_step "cached in $KUBE_BIN"
else
  done_step "not built: the kubernetes tests build it on first need (scripts/kube-cluster.sh build)"
fi

# -- 3c. CRIU, for checkpointed local pool units (scripts/criu.sh: Debian unstable's build, unpacked) -----------
step "CRIU (checkpoint: true)"
if [[ "$FOR" == demo ]]; then
  done_step "not needed for the demo"
elif CRIU_ROOT=$(bash scripts/criu.sh path); then
  done_step "present in $CRIU_ROOT"
else
  quiet bash scripts/criu.sh fetch
  done_step "fetched into $(bash scripts/criu.sh path)"
fi

# -- 4. images ---------------------------------------------------------------------------------
step "image: desktop"
IMAGE_T=$STEP_T
echo >&2
"$VENV/bin/ale-iac" images build desktop >&2
# The label again after the build's own lines, with the time since the step began (the build's included).
step "image: desktop"; STEP_T=$IMAGE_T; done_step "ready"

printf '[setup] all done in %d s\n' "$(( $(date +%s) - T0 ))" >&2
