#!/usr/bin/env bash
# The main job: set everything up (idempotent), then run the demo experiment end to end on the
# embedded `local` profile: the reference agent on three tasks, graded, records under runs/,
# every sandbox destroyed afterwards.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh --for demo
exec .venv/bin/ale-iac evaluate examples/demo.yaml "$@"
