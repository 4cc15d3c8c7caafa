"""ALE-Claw (agents/ale_claw): the overhead of each thick tool over the raw bridge call it wraps, and the
harness's own CPU per step.

    .venv/bin/python bench/bench_harness.py [--endpoint URL] [--runs 50] [--steps 40]

Without ``--endpoint`` it starts a ``local`` sandbox from the ``desktop`` image and stops it at the end.

1. Tool overhead: the same work through a thick tool (``Toolbox.run``: argument handling, the
   liveness ping before a call that must not be sent twice, paging, line numbering, image decoding)
   and through the raw bridge call (the same MCP session), alternating, medians in ms.
2. CPU per step: a whole run (install -> launch) against ``ale-iac model-server`` in a separate process
   (so its CPU is not counted), ``--steps`` model turns alternating ``exec true`` and a screenshot, on
   each SDK; this process's CPU time (user + system, all threads: the loop, the SDK, the MCP client,
   the context policy) divided by the turns. The bridges are child processes and not counted.
3. Context view: ``context.render`` over a history of N turns with a screenshot each (CPU per call).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from ale_iac.agent_sdk import AgentConfig, ModelGrant, load_deployer_class
from ale_iac.contract import ENDPOINT_TOKEN_ENV
from ale_iac.executors.local import LocalExecutor
from ale_iac.sandbox.handle import SandboxHandle

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "agents" / "ale_claw"
PRESETS = {"anthropic": "preset.yaml", "openai": "preset-openai.yaml"}


def preset(api: str, **settings: Any) -> AgentConfig:
    data = yaml.safe_load((AGENT / PRESETS[api]).read_text())
    data["settings"] = {**data.get("settings", {}), **settings}
    return AgentConfig.model_validate({**data, "source_dir": str(AGENT)})


def deployer_module() -> ModuleType:
    return sys.modules[load_deployer_class(preset("anthropic")).__module__]


def executor(handle: SandboxHandle, work_dir: Path, api: str = "anthropic", root: str = "") -> LocalExecutor:
    grant = ModelGrant(api=api, model="scripted-model", token="bench", tcp_root=root, attach_unix=lambda p: None)  # type: ignore[arg-type]
    return LocalExecutor(config=preset(api), sandbox=handle, work_dir=work_dir, env={}, model=grant)


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def tool_overhead(handle: SandboxHandle, runs: int) -> None:
    mod = deployer_module()
    bridges, tools = mod.bridges, mod.tools
    with tempfile.TemporaryDirectory() as tmp:
        ex = executor(handle, Path(tmp))
        held = {k: bridges.Bridge(k, (lambda k=k: ex.bridge(k)), 60) for k in ("vm", "cua")}
        await asyncio.gather(*(b.start() for b in held.values()))
        try:
            caller = tools.BridgeCaller(held, 120, bridges.BridgeDiedError)
            box = tools.Toolbox(
                caller,
                page_chars=12000,
                exec_timeout_s=120,
                max_exec_timeout_s=600,
                read_lines=2000,
                generation=lambda k: held[k].generation,
            )
            path = "/tmp/ale-claw-bench.txt"
            text = "".join(f"line {n}\n" for n in range(200))
            await held["vm"].call("write_text", {"path": path, "content": text}, 30)
            started = await box.run("terminal", {"action": "start", "command": "cat"})
            pid = box.terminals[started.extra["session"]][0]
            toggle = _Toggle(box, path)

            async def raw(kind: str, tool: str, args: dict[str, Any]) -> None:
                result = await held[kind].call(tool, args, 120)
                assert not result.is_error, result.text
                if tool in ("screenshot", "read_bytes"):
                    data = result.images[0][0] if result.images else result.text
                    base64.b64decode(data)

            async def thick(name: str, args: dict[str, Any]) -> None:
                outcome = await box.run(name, args)
                assert not outcome.is_error, outcome.text

            cases: list[tuple[str, Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]] = [
                (
                    "exec true",
                    lambda: raw("vm", "run_command", {"command": "true", "timeout": 120}),
                    lambda: thick("exec", {"command": "true"}),
                ),
                (
                    "read 200 lines",
                    lambda: raw("vm", "read_bytes", {"path": path}),
                    lambda: thick("read", {"path": path}),
                ),
                (
                    "write 1.4 KB",
                    lambda: raw("vm", "write_text", {"path": path, "content": text}),
                    lambda: thick("write", {"path": path, "content": text}),
                ),
                (
                    "edit",
                    lambda: _raw_edit(held["vm"], path),
                    toggle.edit,
                ),
                (
                    "clipboard write",
                    lambda: raw("vm", "write_clipboard", {"text": "bench"}),
                    lambda: thick("clipboard", {"action": "write", "text": "bench"}),
                ),
                (
                    "screenshot",
                    lambda: raw("cua", "screenshot", {}),
                    lambda: thick("computer", {"action": "screenshot"}),
                ),
                (
                    "mouse move",
                    lambda: raw("cua", "mouse_move", {"coordinate": [500, 500]}),
                    lambda: thick("computer", {"action": "move", "coordinate": [500, 500]}),
                ),
                (
                    "terminal send",
                    lambda: _pty_raw(held["vm"], pid),
                    lambda: thick("terminal", {"action": "send", "session": 1, "input": "x\n", "timeout_ms": 2000}),
                ),
            ]
            print(f"{runs} calls each after 3 warm-up calls; medians in ms\n")
            print(f"{'tool':<17} {'raw bridge':>10} {'thick':>10} {'overhead':>9}")
            for name, raw_call, thick_call in cases:
                for _ in range(3):
                    await raw_call()
                    await thick_call()
                a: list[float] = []
                b: list[float] = []
                for _ in range(runs):
                    a.append(await timed(raw_call))
                    b.append(await timed(thick_call))
                ra, rb = statistics.median(a) * 1000, statistics.median(b) * 1000
                print(f"{name:<17} {ra:>10.2f} {rb:>10.2f} {rb - ra:>+9.2f}")
            ping = [await timed(held["vm"].alive) for _ in range(runs)]
            print(f"\nliveness ping (before exec, click, type, key, terminal): {statistics.median(ping) * 1000:.2f} ms")
        finally:
            for b in held.values():
                await b.close()


class _Toggle:
    """Edits that flip one line back and forth, so that every edit finds its string exactly once."""

    def __init__(self, box: Any, path: str) -> None:
        self.box, self.path, self.flipped = box, path, False

    async def edit(self) -> None:
        old, new = ("line seven\n", "line 7\n") if self.flipped else ("line 7\n", "line seven\n")
        outcome = await self.box.run("edit", {"path": self.path, "old_string": old, "new_string": new})
        assert not outcome.is_error, outcome.text
        self.flipped = not self.flipped


async def _raw_edit(bridge: Any, path: str) -> None:
    """What an edit costs on the raw bridge: read the file, write it back."""
    result = await bridge.call("read_text", {"path": path}, 30)
    await bridge.call("write_text", {"path": path, "content": result.text}, 30)


async def _pty_raw(bridge: Any, pid: int) -> None:
    await bridge.call("pty_input", {"pid": pid, "data": "x\n"}, 30)
    await bridge.call("pty_read", {"pid": pid, "timeout_ms": 2000}, 30)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_per_step(handle: SandboxHandle, steps: int) -> None:
    turns: list[dict[str, Any]] = []
    for n in range(steps - 1):
        if n % 2:
            turns.append({"tool": "fn:computer", "arguments": {"action": "screenshot"}})
        else:
            turns.append({"tool": "fn:exec", "arguments": {"command": "seq 1 200"}})
    turns.append({"text": "done"})
    print(f"\nwhole runs of {steps} model turns (exec / screenshot alternating), model server in another process")
    print(f"{'api':<10} {'wall s':>8} {'CPU s':>8} {'CPU ms/step':>12} {'wall ms/step':>13}")
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.yaml"
        plan.write_text(yaml.safe_dump({"scripts": [{"match": ".", "turns": turns}]}))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = subprocess.Popen(
            [sys.executable, "-m", "ale_iac", "model-server", "--plan", str(plan), "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            assert server.stdout is not None
            server.stdout.readline()  # its first line: the base URLs, printed once it listens
            for api in PRESETS:
                ex = executor(handle, Path(tmp) / api, api, f"http://127.0.0.1:{port}")
                deployer = load_deployer_class(ex.config)(ex)

                async def unit(d: Any = deployer) -> Any:
                    await d.install()
                    return await d.launch("bench")

                wall0, cpu0 = time.perf_counter(), cpu_s()
                result = asyncio.run(unit())
                wall, cpu = time.perf_counter() - wall0, cpu_s() - cpu0
                assert result.status == "completed", result.error
                print(f"{api:<10} {wall:>8.2f} {cpu:>8.2f} {cpu / steps * 1000:>12.1f} {wall / steps * 1000:>13.1f}")
        finally:
            server.terminate()
            server.wait(10)


def render_cost() -> None:
    ctx = deployer_module().context
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (1024, 768), "white").save(out, format="PNG")
    png = out.getvalue()
    policy = ctx.Policy(200_000, 4096, 0.8, 3, 3, 4, 2000)
    print("\ncontext.render per call (a screenshot and a 3 KB output per turn)")
    for n in (10, 50, 100):
        history = [ctx.Turn("user", "task")]
        for i in range(n):
            history.append(ctx.Turn("assistant", "thinking", [ctx.Call(f"c{i}", "computer", {"action": "x"})]))
            shot = ctx.Shot(png, "image/png", f"s{i}.png")
            history.append(ctx.Turn("tool", results=[ctx.Result(f"c{i}", "computer", "y" * 3000, False, [shot])]))
        ctx.render(history, policy)  # downscales are made once and kept
        start = time.process_time()
        for _ in range(20):
            ctx.render(history, policy)
        print(f"  {n:>3} turns: {(time.process_time() - start) / 20 * 1000:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--endpoint", help=f"computer-server URL (token from {ENDPOINT_TOKEN_ENV})")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    def go(endpoint: str, token: str | None) -> None:
        handle = SandboxHandle.for_endpoint(endpoint, token=token)
        asyncio.run(tool_overhead(handle, args.runs))
        cpu_per_step(handle, args.steps)
        render_cost()

    if args.endpoint:
        go(args.endpoint, os.environ.get(ENDPOINT_TOKEN_ENV))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_bridges import local_sandbox

    with local_sandbox() as (endpoint, token):
        go(endpoint, token)


if __name__ == "__main__":
    main()
