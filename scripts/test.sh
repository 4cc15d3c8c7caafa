#!/usr/bin/env bash
# The test command: does all the setup (idempotent, fast when already done), then runs every test,
# the slow real-substrate ones included (real Pulumi engine, real local sandboxes, real MCP client).
# Extra arguments go to pytest: `./scripts/test.sh -m fast` is the fast lane after the same checks.
# A test whose precondition (marker) is missing is skipped with the reason, or fails under CI=true.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
echo "[test] ruff (lint, format) + mypy + import contracts + dead code" >&2
.venv/bin/ruff check ale_iac tests agents examples bench
.venv/bin/ruff format --check ale_iac tests agents examples bench
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/vulture ale_iac agents examples tests bench scripts/vulture_whitelist.py --min-confidence 60
echo "[test] pytest" >&2
exec .venv/bin/pytest -n "${ALE_IAC_TEST_WORKERS:-2}" --dist loadgroup "$@"
