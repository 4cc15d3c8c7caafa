#!/usr/bin/env bash
# The test command: does all the setup (idempotent, fast when already done), then runs every test,
# the slow real-substrate ones included (real Pulumi engine, real local sandboxes, real MCP client).
# Extra arguments go to pytest: `./scripts/test.sh -m fast` is the fast lane after the same checks.
# A test whose precondition (marker) is missing is skipped with the reason, or fails under CI=true.
#
# mypy --strict runs beside pytest, not before it: cold, it spends about 4 CPU-minutes reading the cloud SDKs'
# types (pulumi_gcp, pulumi_aws, pulumi_alicloud), time the real-substrate tests leave partly idle. Its cache
# lives in ~/.cache/ale-iac/mypy (valid across clones: mypy checks content hashes), so a rerun takes seconds.
# Its result is printed after pytest's, and either failing fails the command; pytest's summary line is repeated
# last.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh --for tests
CACHE="${ALE_IAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ale-iac}"
mkdir -p "$CACHE/mypy"

echo "[test] ruff (lint, format) + import contracts + dead code" >&2
.venv/bin/ruff check ale_iac tests agents examples bench
.venv/bin/ruff format --check ale_iac tests agents examples bench
.venv/bin/lint-imports
.venv/bin/vulture ale_iac agents examples tests bench scripts/vulture_whitelist.py --min-confidence 60

WORK=$(mktemp -d)
MYPY_PID=""
finish() {
  if [[ -n "$MYPY_PID" ]]; then pkill -P "$MYPY_PID" 2>/dev/null || true; kill "$MYPY_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap finish EXIT
echo "[test] mypy --strict (beside pytest; its result comes after pytest's)" >&2
(
  t0=$(date +%s)
  rc=0
  .venv/bin/mypy --cache-dir "$CACHE/mypy" >"$WORK/mypy.log" 2>&1 || rc=$?
  echo "$(( $(date +%s) - t0 ))" >"$WORK/mypy.secs"
  exit "$rc"
) &
MYPY_PID=$!

echo "[test] pytest" >&2
set +e
.venv/bin/pytest -n "${ALE_IAC_TEST_WORKERS:-2}" --dist loadgroup "$@" 2>&1 | tee "$WORK/pytest.log"
pytest_rc=${PIPESTATUS[0]}
set -e

mypy_rc=0
wait "$MYPY_PID" || mypy_rc=$?
MYPY_PID=""
echo "[test] mypy --strict: exit $mypy_rc in $(cat "$WORK/mypy.secs" 2>/dev/null || echo '?') s" >&2
cat "$WORK/mypy.log"
tail -n 1 "$WORK/pytest.log"
if ((mypy_rc != 0)); then exit "$mypy_rc"; fi
exit "$pytest_rc"
