"""Overhead of the MCP bridges: the same call through a bridge (real mcp client over stdio, spawning
``ale-iac mcp vm|cua``) and straight through ``ComputerServerClient``.

    .venv/bin/python bench/bench_bridges.py [--endpoint URL] [--runs 100] [--warmup 10]

Without ``--endpoint`` it starts a ``local`` sandbox from the ``desktop`` image (building the image
if needed) and stops it at the end. Measured: ``run_command`` of ``true`` (vm bridge) and a full-screen
``screenshot`` (cua bridge); calls alternate between the two paths so drift hits both alike. Also
reported: bridge start-up, from spawning the process to a completed MCP ``initialize``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from ale_iac.contract import ENDPOINT_TOKEN_ENV
from ale_iac.sandbox.client import ComputerServerClient

ALE_IAC = str(Path(sys.executable).with_name("ale-iac"))


@asynccontextmanager
async def bridge(kind: str, endpoint: str, token: str | None) -> AsyncIterator[tuple[ClientSession, float]]:
    env = {ENDPOINT_TOKEN_ENV: token} if token else None
    params = StdioServerParameters(command=ALE_IAC, args=["mcp", kind, "--endpoint", endpoint], env=env)
    started = time.perf_counter()
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session, time.perf_counter() - started


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def compare(
    direct: Callable[[], Awaitable[object]], bridged: Callable[[], Awaitable[object]], runs: int, warmup: int
) -> tuple[list[float], list[float]]:
    for _ in range(warmup):
        await direct()
        await bridged()
    a: list[float] = []
    b: list[float] = []
    for _ in range(runs):
        a.append(await timed(direct))
        b.append(await timed(bridged))
    return a, b


def row(name: str, direct: list[float], bridged: list[float]) -> str:
    d, b = statistics.median(direct) * 1000, statistics.median(bridged) * 1000
    return f"{name:<13} {d:>10.2f} {b:>10.2f} {b / d:>7.2f}x {b - d:>+9.2f}"


async def run(endpoint: str, token: str | None, runs: int, warmup: int) -> None:
    async with ComputerServerClient(endpoint, token=token) as client:
        version = await client.check_version()
        size = await client.screen_size()
        print(f"endpoint {endpoint}: cua-computer-server {version.package}, screen {size[0]}x{size[1]}")
        print(f"{runs} calls each after {warmup} warm-up calls; medians in ms\n")
        async with (
            bridge("vm", endpoint, token) as (vm, vm_start),
            bridge("cua", endpoint, token) as (cua, cua_start),
        ):

            async def vm_run() -> None:
                result = await vm.call_tool("run_command", {"command": "true"})
                assert not result.is_error, result

            async def cua_shot() -> None:
                result = await cua.call_tool("screenshot", {})
                assert not result.is_error, result

            cmd_direct, cmd_bridge = await compare(lambda: client.run_command("true"), vm_run, runs, warmup)
            shot_direct, shot_bridge = await compare(client.screenshot, cua_shot, runs, warmup)
    print(f"{'call':<13} {'client':>10} {'bridge':>10} {'ratio':>8} {'overhead':>9}")
    print(row("run_command", cmd_direct, cmd_bridge) + "   (vm bridge)")
    print(row("screenshot", shot_direct, shot_bridge) + "   (cua bridge)")
    print(f"\nbridge start-up to initialized: vm {vm_start:.2f} s, cua {cua_start:.2f} s")


@contextmanager
def local_sandbox() -> Iterator[tuple[str, str]]:
    from ale_iac.image_build import build_image
    from ale_iac.substrates.local import runtime as local_runtime
    from ale_iac.substrates.local import sandboxes as local_sandboxes
    from ale_iac.substrates.local.sandboxes import LocalSandboxSpec

    image = build_image("desktop")
    spec = LocalSandboxSpec(sandbox_id=f"bench-{int(time.time())}", rootfs=str(image.rootfs))
    state = local_runtime.start(spec)
    try:
        token = local_sandboxes.auth_token(state)
        asyncio.run(_wait_ready(state.endpoint, token))
        yield state.endpoint, token
    finally:
        local_runtime.stop(state.sandbox_id)


async def _wait_ready(endpoint: str, token: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    async with ComputerServerClient(endpoint, connect_timeout=1, token=token) as client:
        while True:
            try:
                await client.status()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--endpoint", help=f"computer-server URL (token from {ENDPOINT_TOKEN_ENV}); default: start a local sandbox"
    )
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    if args.endpoint:
        asyncio.run(run(args.endpoint, os.environ.get(ENDPOINT_TOKEN_ENV), args.runs, args.warmup))
        return
    with local_sandbox() as (endpoint, token):
        asyncio.run(run(endpoint, token, args.runs, args.warmup))


if __name__ == "__main__":
    main()
