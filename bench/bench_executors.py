#!/usr/bin/env python3
"""Benchmark of the executors: per-unit overhead of running a deployer away from the runner's process.

    .venv/bin/python bench/bench_executors.py [--runs 5] [--executors local,sandbox,docker] [--cli claude-code]

One local sandbox from the desktop image serves every run. The deployer is the executor tests' probe
(tests/executors/presets/probe): a shell command, the cua bridge started where it runs with one
screenshot, a report file; no model. For each executor:

* ``run_deployer`` wall time per unit (p50/p95/max over ``--runs``), the probe's own work included;
  the first sample of ``sandbox`` is the cold one (the runtime bundle shipped into a fresh sandbox),
  reported apart;
* ``--cli NAME``: the time to carry an agent CLI's archive into a fresh folder of the sandbox
  (what a unit pays once per sandbox), with its size.

The overhead of an executor is its p50 minus ``local``'s. Run as root; stops what it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ale_iac.agent_sdk import AgentConfig, load_deployer_class  # noqa: E402
from ale_iac.agent_sdk.executor_registry import executor_class  # noqa: E402
from ale_iac.images import require_image  # noqa: E402
from ale_iac.runner.records import Redactor  # noqa: E402
from ale_iac.substrates.local import runtime as local_runtime  # noqa: E402
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec  # noqa: E402
from tests.support.sandbox import handle_of, wait_for_status  # noqa: E402

PROBE = REPO / "tests" / "executors" / "presets" / "probe"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def one_run(kind: str, handle: object, work: Path, clis: dict[str, object]) -> float:
    data = yaml.safe_load((PROBE / "preset.yaml").read_text())
    config = AgentConfig.model_validate({**data, "executor": kind, "source_dir": str(PROBE)})
    work.mkdir(parents=True)
    executor = executor_class(kind)(
        config=config,
        sandbox=handle,
        work_dir=work,
        env={},
        redact=Redactor(),
        clis=clis,  # type: ignore[arg-type]
    )
    deployer = load_deployer_class(config)(executor)
    start = time.monotonic()
    result = await executor.run_deployer(deployer, "bench", 120)
    elapsed = time.monotonic() - start
    if result.status != "completed":
        raise SystemExit(f"{kind}: {result}")
    return elapsed


async def ship_cli(handle: object, name: str) -> tuple[float, int]:
    from ale_iac.agent_sdk.clis import archive, ensure_cli
    from ale_iac.executors.sandbox import ship_archive

    path = await asyncio.to_thread(archive, ensure_cli(name))
    start = time.monotonic()
    async with handle.client(timeout=600) as client:  # type: ignore[attr-defined]
        await ship_archive(client, path, f"/root/.ale/.bench-{secrets.token_hex(3)}")
    return time.monotonic() - start, path.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--executors", default="local,sandbox")
    parser.add_argument("--cli", default=None)
    args = parser.parse_args()
    image = require_image("desktop")
    spec = LocalSandboxSpec(sandbox_id=f"bench-exec-{secrets.token_hex(3)}", rootfs=str(image.rootfs))
    state = local_runtime.start(spec)
    try:
        wait_for_status(state)
        handle = handle_of(state)
        with tempfile.TemporaryDirectory() as tmp:
            for kind in args.executors.split(","):
                samples = [
                    asyncio.run(one_run(kind, handle, Path(tmp) / f"{kind}-{i}" / "agent", {}))
                    for i in range(args.runs + (1 if kind == "sandbox" else 0))
                ]
                if kind == "sandbox":
                    print(f"sandbox cold (bundle shipped): {samples[0]:.2f} s")
                    samples = samples[1:]
                print(
                    f"{kind:8s} run_deployer p50 {pct(samples, 0.5):.2f} s  p95 {pct(samples, 0.95):.2f} s  "
                    f"max {max(samples):.2f} s  (n={len(samples)})"
                )
            if args.cli:
                seconds, size = asyncio.run(ship_cli(handle, args.cli))
                print(f"carry {args.cli} into the sandbox: {seconds:.2f} s for {size / 2**20:.0f} MiB (compressed)")
    finally:
        local_runtime.stop(state.sandbox_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
