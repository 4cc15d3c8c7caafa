"""Warm bridges: ``ale-iac mcp vm`` (this host's runs) and ``python -m ale_iac.bridges vm`` (the runtime bundle's,
inside a sandbox or an agent's container) forked by a process that imported the bridges once, driven by the real
MCP client over the forwarder's own stdio; a killed forwarder takes its bridge along."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import psutil
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from ale_iac.bridges.warm import ENTRY, ENTRY_BRIDGES, WARM_ENV, WarmBridges, sweep_stale
from tests.support.bridges import gated_python
from tests.support.sandbox import Endpoint

pytestmark = pytest.mark.sandbox


BRIDGE_ARGV = {ENTRY: ["-m", "ale_iac", "mcp", "vm"], ENTRY_BRIDGES: ["-m", "ale_iac.bridges", "vm"]}
"""How each entry's bridge is started (the forwarder's command line)."""


@pytest.fixture(params=[ENTRY, ENTRY_BRIDGES])
def warm(request: pytest.FixtureRequest) -> Iterator[WarmBridges]:
    with WarmBridges(request.param) as bridges:
        yield bridges
    assert not bridges.socket_path.parent.exists()


def _forked(warm: WarmBridges) -> list[psutil.Process]:
    assert warm.pid is not None
    return psutil.Process(warm.pid).children()


def _wait_for(check: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        assert time.monotonic() < deadline, f"still waiting for {what} after {limit_s:.0f} s"
        time.sleep(0.05)


def _session(
    endpoint: Endpoint, env: dict[str, str], during: Callable[[], None] = lambda: None, entry: str = ENTRY
) -> str:
    params = StdioServerParameters(
        command=sys.executable,
        args=[*BRIDGE_ARGV[entry], "--endpoint", endpoint.url],
        env={**os.environ, **endpoint.bridge_env(), **env},
    )

    async def run() -> str:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            names = {tool.name for tool in (await client.list_tools()).tools}
            assert {"run_command", "read_text", "write_text"} <= names
            result = await client.call_tool("run_command", {"command": "echo warm-$((6*7))"})
            during()
            first = result.content[0]
            return first.text if first.type == "text" else ""

    return anyio.run(run)


def test_the_real_client_drives_a_warm_bridge(computer_server_endpoint: Endpoint, warm: WarmBridges) -> None:
    seen: list[int] = []

    def one_forked_bridge_serves() -> None:
        children = _forked(warm)
        assert len(children) == 1
        assert "ale_iac.bridges.warm" in " ".join(children[0].cmdline())  # forked, not exec'd anew
        seen.append(children[0].pid)

    text = _session(computer_server_endpoint, warm.env, one_forked_bridge_serves, warm.entry)
    assert text == "exit_code: 0\nstdout:\nwarm-42\n"
    # The client closed the bridge's stdin: the forked bridge ended, and told its forwarder how.
    # Reaped, not only dead: the server ignores SIGCHLD, so the kernel releases the child itself, but a child
    # that has just exited shows as a zombie until it has (a moment the check must not mistake for a leak).
    _wait_for(lambda: seen[0] not in [child.pid for child in _forked(warm)], "the bridge to be reaped")
    assert _forked(warm) == []


def test_killing_the_forwarder_ends_its_bridge(computer_server_endpoint: Endpoint, warm: WarmBridges) -> None:
    forwarder = subprocess.Popen(
        [sys.executable, *BRIDGE_ARGV[warm.entry], "--endpoint", computer_server_endpoint.url],
        env={**os.environ, **computer_server_endpoint.bridge_env(), **warm.env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        _wait_for(lambda: len(_forked(warm)) == 1, "the forked bridge")
        [bridge] = _forked(warm)
        os.kill(forwarder.pid, signal.SIGKILL)  # as an MCP client that kills what it started
        forwarder.wait()
        _wait_for(lambda: not bridge.is_running() or bridge.status() == psutil.STATUS_ZOMBIE, "the bridge to end")
    finally:
        if forwarder.poll() is None:
            forwarder.kill()
            forwarder.wait()


@pytest.mark.parametrize("entry", [ENTRY, ENTRY_BRIDGES])
def test_without_a_warm_process_the_bridge_runs_itself(
    computer_server_endpoint: Endpoint, tmp_path: Path, entry: str
) -> None:
    text = _session(computer_server_endpoint, {WARM_ENV: str(tmp_path / "no-such.sock")}, entry=entry)
    assert text == "exit_code: 0\nstdout:\nwarm-42\n"


def test_a_bridge_asked_for_while_the_warm_process_imports_is_forked_by_it(
    computer_server_endpoint: Endpoint,
) -> None:
    """A warm process started without waiting (``start(wait=False)``, as the agent's entry starts it, to import
    while the deployer installs): the socket listens before the imports, so a bridge asked for meanwhile waits in
    the backlog and is forked, not started anew."""
    warm = WarmBridges(ENTRY_BRIDGES)
    warm.start(wait=False)
    try:
        _wait_for(warm.socket_path.exists, "the warm process's socket")
        forked: list[bool] = []

        def check() -> None:
            forked.extend("ale_iac.bridges.warm" in " ".join(c.cmdline()) for c in _forked(warm))

        text = _session(computer_server_endpoint, warm.env, check, ENTRY_BRIDGES)
        assert text == "exit_code: 0\nstdout:\nwarm-42\n"
        assert forked == [True]
    finally:
        warm.close()


def test_the_warm_process_forks_only_bridges(warm: WarmBridges) -> None:
    """Another ``ale-iac`` command with the variable set runs itself, in its own process."""
    done = subprocess.run(
        [sys.executable, "-m", "ale_iac", "--help"],
        env={**os.environ, **warm.env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "mcp" in done.stdout
    assert _forked(warm) == []


def test_a_warm_process_whose_run_died_removes_its_folder() -> None:
    """The run's end of the pipe closes without a close() (the run was SIGKILLed alone)."""
    bridges = WarmBridges()
    bridges.start()
    proc = bridges._proc
    assert proc is not None and proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=60)
    assert not bridges.socket_path.parent.exists()
    bridges.close()


_KILLED_RUN = """
import sys
from ale_iac.bridges.warm import WarmBridges
bridges = WarmBridges()
bridges.start()
print(bridges.socket_path.parent, bridges.pid, flush=True)
sys.stdin.read()
"""


def test_gc_sweeps_the_folder_of_a_run_killed_with_its_warm_process_and_spares_a_live_one() -> None:
    with WarmBridges() as live:
        # A run and its warm process, both SIGKILLed: no cleanup ran. The warm process first: killed as a group,
        # the run's death closes the warm process's stdin, and a warm process that sees that before its own
        # SIGKILL lands removes its folder on the way out (it did once in CI, on a loaded host).
        run = subprocess.Popen(
            [sys.executable, "-c", _KILLED_RUN],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert run.stdout is not None
        folder_text, warm_pid = run.stdout.readline().split()
        folder = Path(folder_text)
        os.kill(int(warm_pid), signal.SIGKILL)
        _wait_for(
            lambda: not psutil.pid_exists(int(warm_pid)) or psutil.Process(int(warm_pid)).status() == "zombie",
            "the kill",
        )
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
        root = live.socket_path.parent.parent
        assert folder in sweep_stale(root, dry_run=True)
        assert folder.exists()
        assert folder in sweep_stale(root)
        assert not folder.exists()
        assert live.socket_path.exists() and live.socket_path.parent not in sweep_stale(root)


def test_gc_spares_the_folder_of_a_live_run_whose_warm_process_is_still_starting() -> None:
    """Between the folder's creation and the socket's bind the warm process imports for a second or more:
    a gc on the host at that moment must not take the folder (the bind would then fail)."""
    starting = WarmBridges()  # folder made, nothing started yet: no socket
    try:
        root = starting.socket_path.parent.parent
        assert starting.socket_path.parent not in sweep_stale(root)
        starting.start()
        assert starting.socket_path.exists()
    finally:
        starting.close()


def test_wait_ready_says_whether_the_imports_are_done(tmp_path: Path) -> None:
    warm = WarmBridges(ENTRY_BRIDGES, python=gated_python(tmp_path / "gate"))
    warm.start(wait=False)
    try:
        assert warm.wait_ready(0.2) is False  # still starting: it waits for the gate
        (tmp_path / "gate").touch()
        assert warm.wait_ready(120) is True
        assert warm.wait_ready(0) is True  # and so on every later call
    finally:
        warm.close()


def test_a_warm_process_that_ends_without_importing_raises_and_leaves_no_folder() -> None:
    warm = WarmBridges(ENTRY_BRIDGES, python=["/bin/sh", "-c", "exit 3"])
    warm.start(wait=False)
    with pytest.raises(RuntimeError, match="did not start"):
        warm.wait_ready(60)
    assert not warm.socket_path.parent.exists()
    warm.close()
