"""The vm bridge through the real MCP client over stdio, against a real computer-server.

Every tool is called and its effect checked through another channel (a written file read back with
``cat``, the clipboard read with ``xclip``); return texts are compared with the forms of the MCP tools
specification, which is encoded below as data.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shlex
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from ale_iac.agent_sdk import AgentConfig, make_executor
from ale_iac.contract import COMMAND_ENV_ENV
from ale_iac.egress_policy import EgressPolicy
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.egress import IN_UNIT_PROXY, PROXY_ENV
from tests.support import desktop
from tests.support.bridges import ALE_IAC, OPTIONAL, REQUIRED, Bridge, assert_matches_seed, open_bridge, sh
from tests.support.sandbox import Endpoint

pytestmark = pytest.mark.sandbox

# The seed's vm_mcp_server table: tool -> parameter -> REQUIRED, OPTIONAL or its default value.
SEED_VM: dict[str, dict[str, Any]] = {
    "run_command": {"command": REQUIRED, "timeout": OPTIONAL},
    "read_text": {"path": REQUIRED},
    "write_text": {"path": REQUIRED, "content": REQUIRED},
    "read_bytes": {"path": REQUIRED, "offset": 0, "length": OPTIONAL},
    "write_bytes": {"path": REQUIRED, "content_b64": REQUIRED, "append": False},
    "read_clipboard": {},
    "write_clipboard": {"text": REQUIRED},
    "pty_start": {"command": "bash", "cwd": OPTIONAL, "env": OPTIONAL, "cols": 80, "rows": 24},
    "pty_input": {"pid": REQUIRED, "data": REQUIRED},
    "pty_read": {"pid": REQUIRED, "timeout_ms": 2000},
    "pty_resize": {"pid": REQUIRED, "cols": REQUIRED, "rows": REQUIRED},
    "pty_kill": {"pid": REQUIRED},
}
SEED_VM_STRUCTURED = {"run_command": {"exit_code", "stdout", "stderr"}}


def test_tools_match_the_seed(vm_bridge: Bridge) -> None:
    assert_matches_seed(vm_bridge, SEED_VM, SEED_VM_STRUCTURED)


def test_run_command_text_and_structured(vm_bridge: Bridge) -> None:
    result = vm_bridge.call("run_command", command="printf 'out\\n'; printf 'err\\n' >&2; exit 3")
    assert not result.is_error
    assert result.structured_content == {"exit_code": 3, "stdout": "out\n", "stderr": "err\n"}
    assert [block.text for block in result.content if block.type == "text"] == [
        "exit_code: 3\nstdout:\nout\n\nstderr:\nerr\n"
    ]
    assert vm_bridge.text("run_command", command="echo hi") == "exit_code: 0\nstdout:\nhi\n"
    # no shell state between calls
    assert sh(vm_bridge, "cd /usr && export ALE_X=1 && pwd") == "/usr\n"
    assert sh(vm_bridge, 'pwd; echo "[$ALE_X]"') != "/usr\n[1]\n"
    started = time.monotonic()
    timed_out = vm_bridge.call("run_command", command="sleep 20", timeout=1)
    assert time.monotonic() - started < 10
    assert timed_out.structured_content is not None and timed_out.structured_content["exit_code"] == -1
    assert "timed out" in timed_out.structured_content["stderr"]


def test_a_bridge_an_executor_starts_for_a_unit_with_egress_gives_its_commands_the_proxy_variables(
    computer_server_endpoint: Endpoint, tmp_path: Path
) -> None:
    """The local executor's bridge of a handle whose egress is open: what it runs in the unit sees the proxy
    variables, as the runner's own commands do (``SandboxHandle.command_env``, ``ALE_IAC_COMMAND_ENV``)."""
    handle = SandboxHandle.for_endpoint(computer_server_endpoint.url, token=computer_server_endpoint.token)
    opened = handle.with_egress(EgressPolicy(allow=["pypi.org"]).model_dump(mode="json"))
    config = AgentConfig(name="a", deployer="tests.support.agents:WriterAgent")
    executor = make_executor("local", config=config, sandbox=opened, work_dir=tmp_path, env={}, redact=str)
    launch = executor.bridge("vm")
    params = StdioServerParameters(command=launch.command, args=launch.args, env={**os.environ, **launch.env})
    with open_bridge("vm", computer_server_endpoint, tmp_path / "stderr.log", params) as bridge:
        seen = sorted(sh(bridge, "env | grep -i _proxy=").split())
        pid = int(bridge.text("pty_start", command="sh -c 'echo \"[$HTTPS_PROXY]\"'").split()[1])
        assert f"[{IN_UNIT_PROXY}]" in read_pty_until(bridge, pid, r"\[exited, code 0\]$")
    assert seen == sorted(f"{name}={value}" for name, value in PROXY_ENV.items())
    assert (
        COMMAND_ENV_ENV
        not in make_executor("local", config=config, sandbox=handle, work_dir=tmp_path, env={}, redact=str)
        .bridge("vm")
        .env
    )  # no policy: nothing added


def test_text_files(vm_bridge: Bridge) -> None:
    path = f"/tmp/{desktop.unique('text')}.txt"
    content = "héllo\nwörld ✓\n"
    assert vm_bridge.text("write_text", path=path, content=content) == (
        f"Wrote {len(content.encode())} bytes to {path}"
    )
    assert sh(vm_bridge, f"cat {path}") == content
    assert vm_bridge.text("read_text", path=path) == content
    assert vm_bridge.text("write_text", path=path, content="short") == f"Wrote 5 bytes to {path}"  # overwrites
    assert sh(vm_bridge, f"cat {path}") == "short"
    sh(vm_bridge, f"rm -f {path}")


def test_binary_files_with_ranges_and_append(vm_bridge: Bridge) -> None:
    path = f"/tmp/{desktop.unique('bin')}.bin"
    data = os.urandom(200_000)
    encoded = base64.b64encode(data).decode()
    assert vm_bridge.text("write_bytes", path=path, content_b64=encoded) == f"Wrote bytes to {path}"
    assert sh(vm_bridge, f"sha256sum {path}").split()[0] == hashlib.sha256(data).hexdigest()
    assert base64.b64decode(vm_bridge.text("read_bytes", path=path)) == data
    assert base64.b64decode(vm_bridge.text("read_bytes", path=path, offset=1234, length=5000)) == data[1234:6234]
    assert base64.b64decode(vm_bridge.text("read_bytes", path=path, offset=len(data) - 7)) == data[-7:]
    tail = b"\x00\xfftail"
    assert vm_bridge.text("write_bytes", path=path, content_b64=base64.b64encode(tail).decode(), append=True) == (
        f"Wrote bytes to {path}"
    )
    assert sh(vm_bridge, f"stat -c %s {path}") == f"{len(data) + len(tail)}\n"
    assert base64.b64decode(vm_bridge.text("read_bytes", path=path, offset=len(data))) == tail
    sh(vm_bridge, f"rm -f {path}")


def test_clipboard_roundtrip(vm_bridge: Bridge) -> None:
    text = f"clip-ü-{desktop.unique('x')}"
    assert vm_bridge.text("write_clipboard", text=text) == f"Set clipboard ({len(text.encode())} bytes)"
    assert sh(vm_bridge, "xclip -o -selection clipboard") == text
    other = desktop.unique("from-xclip")
    sh(vm_bridge, f"printf %s {other} | xclip -i -selection clipboard >/dev/null 2>&1")
    assert vm_bridge.text("read_clipboard") == other


PTY_TAG = re.compile(r"\[(?:running|exited, code -?\d+)\]\Z")


def read_pty_until(vm: Bridge, pid: int, pattern: str, timeout: float = 15) -> str:
    """The output of ``pty_read`` calls until ``pattern`` is seen, then the last call's tag.

    Each read ends with its tag (``[running]`` or ``[exited, code N]``); a read can come back with no output
    at all, so the tags of the reads before the last are taken out, or they would split the output."""
    output, tag = "", ""
    deadline = time.monotonic() + timeout
    while not re.search(pattern, output + tag):
        assert time.monotonic() < deadline, f"{pattern!r} not seen in {output + tag!r}"
        chunk = vm.text("pty_read", pid=pid, timeout_ms=1000)
        end = PTY_TAG.search(chunk)
        assert end, chunk
        output, tag = output + chunk[: end.start()], end.group()
        if tag.startswith("[exited"):
            break
    return output + tag


def test_pty_runs_an_interactive_program_that_exits_with_a_code(vm_bridge: Bridge) -> None:
    script = 'printf "name? "; read n; echo "hello $n"; exit 7'
    started = vm_bridge.text("pty_start", command=f"sh -c {shlex.quote(script)}")
    match = re.fullmatch(r"pid: (\d+)\ncols: 80\nrows: 24", started)
    assert match, started
    pid = int(match.group(1))
    assert vm_bridge.text("pty_read", pid=pid) == "name? \n[running]"
    assert vm_bridge.text("pty_input", pid=pid, data="bob\n") == f"Sent 4 bytes to pid {pid}"
    out = read_pty_until(vm_bridge, pid, r"\[exited, code 7\]$")
    assert "hello bob" in out
    assert out.endswith("\n[exited, code 7]")
    assert vm_bridge.text("pty_read", pid=pid, timeout_ms=0) == "[exited, code 7]"
    assert vm_bridge.text("pty_kill", pid=pid) == f"Killed pid {pid}"


def test_pty_bash_session(vm_bridge: Bridge) -> None:
    started = vm_bridge.text("pty_start", cwd="/tmp", env={"ALE_PTY": "yes"}, cols=100, rows=30)
    pid = int(started.split()[1])
    assert started == f"pid: {pid}\ncols: 100\nrows: 30"
    assert "[running]" in vm_bridge.text("pty_read", pid=pid)  # the prompt (or nothing) so far
    vm_bridge.text("pty_input", pid=pid, data="echo $((6*7)) $ALE_PTY $PWD\n")
    read_pty_until(vm_bridge, pid, r"42 yes /tmp")
    assert vm_bridge.text("pty_resize", pid=pid, cols=120, rows=40) == f"Resized pid {pid} to 120x40"
    vm_bridge.text("pty_input", pid=pid, data="stty size\n")
    read_pty_until(vm_bridge, pid, r"40 120")
    vm_bridge.text("pty_input", pid=pid, data="sleep 60; echo not-interrupted\n")
    assert vm_bridge.text("pty_input", pid=pid, data="\u0003") == f"Sent 1 bytes to pid {pid}"
    vm_bridge.text("pty_input", pid=pid, data="echo after-$((1+1))\n")
    assert "\nnot-interrupted" not in read_pty_until(vm_bridge, pid, r"after-2")
    assert vm_bridge.text("pty_kill", pid=pid) == f"Killed pid {pid}"
    assert vm_bridge.error("pty_read", pid=pid).endswith(f"No PTY session with pid {pid}")


INVALID_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("write_bytes", {"path": "/tmp/ale-x", "content_b64": "not base64!"}, "content_b64 is not valid base64"),
    ("read_bytes", {"path": "/etc/hostname", "offset": -1}, "invalid argument offset"),
    ("read_bytes", {"path": "/etc/hostname", "length": -3}, "invalid argument length"),
    ("read_text", {"path": "/nonexistent/ale.txt"}, "cannot read /nonexistent/ale.txt: [Errno 2]"),
    ("write_text", {"path": "/nonexistent/dir/f.txt", "content": "x"}, "cannot write /nonexistent/dir/f.txt"),
    ("run_command", {"command": "true", "timeout": 0}, "invalid argument timeout"),
    ("run_command", {"commnd": "true"}, "unknown argument 'commnd'"),
    ("run_command", {}, "missing required argument 'command'"),
    ("pty_input", {"pid": 999999, "data": "x"}, "No PTY session with pid 999999"),
    ("pty_read", {"pid": 999999}, "No PTY session with pid 999999"),
    ("pty_resize", {"pid": 999999, "cols": 0, "rows": 10}, "invalid argument cols"),
    ("pty_kill", {"pid": "abc"}, "invalid argument pid"),
    ("pty_start", {"cols": -1}, "invalid argument cols"),
    ("pty_read", {"pid": 1, "timeout_ms": -5}, "invalid argument timeout_ms"),
]


@pytest.mark.parametrize(("tool", "arguments", "expected"), INVALID_CALLS, ids=[c[2][:40] for c in INVALID_CALLS])
def test_invalid_arguments_are_tool_errors_and_the_bridge_keeps_serving(
    vm_bridge: Bridge, tool: str, arguments: dict[str, Any], expected: str
) -> None:
    message = vm_bridge.error(tool, **arguments)
    assert message.startswith(f"Error executing tool {tool}: ")
    assert expected in message
    assert vm_bridge.text("run_command", command="echo alive") == "exit_code: 0\nstdout:\nalive\n"


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (from /proc/net/tcp, tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_streamable_http_needs_a_bridge_token(computer_server_endpoint: Endpoint) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ALE_IAC_BRIDGE_TOKEN"}
    done = subprocess.run(
        [ALE_IAC, "mcp", "vm", "--endpoint", computer_server_endpoint.url, "--http", "--port", "9"],
        env={**env, **computer_server_endpoint.bridge_env()},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "--http needs a bearer token of at least 16 characters in ALE_IAC_BRIDGE_TOKEN" in done.stderr


def test_streamable_http_bound_to_loopback(computer_server_endpoint: Endpoint, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bridge_token = secrets.token_hex(32)
    log = (tmp_path / "bridge.log").open("wb")
    bridge = subprocess.Popen(
        [ALE_IAC, "mcp", "vm", "--endpoint", computer_server_endpoint.url, "--http", "--port", str(port)],
        env={**os.environ, **computer_server_endpoint.bridge_env(), "ALE_IAC_BRIDGE_TOKEN": bridge_token},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not _listening_addresses(port):
            assert bridge.poll() is None, (tmp_path / "bridge.log").read_text()
            assert time.monotonic() < deadline, "the HTTP bridge did not start listening"
            time.sleep(0.05)
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1 only
        # Another user of this host, without the token, gets nowhere.
        refused = httpx.post(f"http://127.0.0.1:{port}/mcp", json={}, timeout=10)
        assert refused.status_code == 401, refused.text

        async def session() -> tuple[list[str], str]:
            async with (
                httpx2.AsyncClient(headers={"Authorization": f"Bearer {bridge_token}"}) as http_client,
                streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http_client) as (read, write, *_),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                names = [tool.name for tool in (await client.list_tools()).tools]
                result = await client.call_tool("run_command", {"command": "echo over-http"})
                return names, result.content[0].text if result.content[0].type == "text" else ""

        names, text = anyio.run(session)
        assert sorted(names) == sorted(SEED_VM)
        assert text == "exit_code: 0\nstdout:\nover-http\n"
    finally:
        bridge.terminate()
        try:
            bridge.wait(timeout=10)
        except subprocess.TimeoutExpired:
            bridge.kill()
            bridge.wait(timeout=10)
        log.close()


def test_stdio_over_socketpairs_as_node_clients_spawn_it(computer_server_endpoint: Endpoint) -> None:
    """Node-based MCP clients (Claude Code) give the bridge socketpairs, not pipes, as stdin and stdout."""
    stdin_parent, stdin_child = socket.socketpair()
    stdout_parent, stdout_child = socket.socketpair()
    bridge = subprocess.Popen(
        [ALE_IAC, "mcp", "vm", "--endpoint", computer_server_endpoint.url],
        env={**os.environ, **computer_server_endpoint.bridge_env()},
        stdin=stdin_child.fileno(),
        stdout=stdout_child.fileno(),
    )
    stdin_child.close()
    stdout_child.close()
    requests = stdin_parent.makefile("wb", buffering=0)
    replies = stdout_parent.makefile("rb")

    def rpc(message: dict[str, Any]) -> dict[str, Any] | None:
        requests.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        if "id" not in message:
            return None
        reply: dict[str, Any] = json.loads(replies.readline())
        return reply

    try:
        init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        assert rpc({"id": 1, "method": "initialize", "params": init}) is not None
        rpc({"method": "notifications/initialized"})
        for n in range(2, 5):
            call = {"name": "run_command", "arguments": {"command": f"echo {n}"}}
            reply = rpc({"id": n, "method": "tools/call", "params": call})
            assert reply is not None and reply["result"]["structuredContent"]["stdout"] == f"{n}\n"
        stdin_parent.shutdown(socket.SHUT_WR)  # EOF: the bridge exits by itself
        assert bridge.wait(timeout=15) == 0
    finally:
        if bridge.poll() is None:
            bridge.kill()
            bridge.wait(timeout=10)
        for sock in (stdin_parent, stdout_parent):
            sock.close()
