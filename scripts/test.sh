#!/usr/bin/env bash
# The test command: does all the setup (idempotent, fast when already done), then runs every test,
# the slow real-substrate ones included (real Pulumi engine, real local sandboxes, real MCP client).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
echo "[test] ruff + mypy" >&2
.venv/bin/ruff check ale_iac tests agents examples bench
.venv/bin/mypy
echo "[test] pytest" >&2
exec .venv/bin/pytest -n "${ALE_IAC_TEST_WORKERS:-2}" --dist loadgroup "$@"
