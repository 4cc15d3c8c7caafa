"""The computer-server client against a real server (``computer_server_endpoint``), plus a few protocol
edge cases no real server produces, against a fake transport (named ``test_fake_server_*``)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import struct
import time
from collections.abc import AsyncIterator, Callable

import anyio
import httpx
import pytest

from ale_iac.sandbox import client as client_module
from ale_iac.sandbox.client import FILE_CHUNK_BYTES, ComputerServerClient
from ale_iac.sandbox.keys import UnknownKeyError, normalize_key, normalize_keys
from ale_iac.sandbox.protocol import ComputerServerError, ServerUnreachableError, ServerVersion, UnsupportedServerError
from tests.support import desktop
from tests.support.sandbox import Endpoint

# The tests against the real server carry `sandbox`; the fake-server and key-name ones need nothing.
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def client(computer_server_endpoint: Endpoint) -> AsyncIterator[ComputerServerClient]:
    async with computer_server_endpoint.client() as c:
        yield c


async def sh(client: ComputerServerClient, command: str) -> str:
    result = await client.run_command(command, timeout=30)
    assert result.exit_code == 0, f"{command!r} failed: {result}"
    return result.stdout


@pytest.mark.sandbox
async def test_version_is_supported(client: ComputerServerClient) -> None:
    status = await client.status()
    assert status["status"] == "ok"
    version = await client.check_version()
    assert version.protocol == 1
    assert version.package.startswith("0.3.")


@pytest.mark.sandbox
async def test_run_command_exit_code_stdout_stderr(client: ComputerServerClient) -> None:
    result = await client.run_command("printf 'out\\n'; printf 'err\\n' >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
    assert (await client.run_command("true")).exit_code == 0


@pytest.mark.sandbox
async def test_run_command_timeout_kills_the_command(client: ComputerServerClient) -> None:
    started = time.monotonic()
    result = await client.run_command("sleep 20", timeout=1)
    assert time.monotonic() - started < 10
    assert result.timed_out
    assert result.exit_code == -1
    assert "timed out" in result.stderr


@pytest.mark.sandbox
async def test_background_process_does_not_hold_run_command(client: ComputerServerClient) -> None:
    """A command that leaves a process behind (``app &``) returns at once. It does not when the server runs
    under uvloop, whose children inherit the reply pipes: the image must ship the server without uvloop."""
    started = time.monotonic()
    result = await client.run_command("sleep 30 >/dev/null 2>&1 & echo $!", timeout=10)
    assert not result.timed_out, "run_command waited for a background process: is uvloop in the server's venv?"
    assert time.monotonic() - started < 5
    await client.run_command(f"kill {int(result.stdout)}")


@pytest.mark.sandbox
async def test_binary_file_of_one_mib_roundtrips_in_ranges(client: ComputerServerClient) -> None:
    path = f"/tmp/{desktop.unique('blob')}.bin"
    data = os.urandom(1024 * 1024 + 12345)
    await client.write_bytes(path, data)
    try:
        assert await client.file_size(path) == len(data)
        digest = (await sh(client, f"sha256sum {path}")).split()[0]
        assert digest == hashlib.sha256(data).hexdigest()  # checked by the sandbox, not by the client
        assert await client.read_bytes(path) == data
        ranges = [(0, 1), (1, 1000), (FILE_CHUNK_BYTES - 3, 7), (777, FILE_CHUNK_BYTES + 5), (len(data) - 10, 100)]
        for offset, length in ranges:
            assert await client.read_bytes(path, offset, length) == data[offset : offset + length]
        assert await client.read_bytes(path, len(data) + 5, 10) == b""
        await client.write_bytes(path, b"\x00tail\xff", append=True)
        assert await client.read_bytes(path, len(data)) == b"\x00tail\xff"
        with pytest.raises(ValueError, match="offset"):
            await client.read_bytes(path, -1)
        with pytest.raises(ValueError, match="length"):
            await client.read_bytes(path, 0, -5)
    finally:
        await client.run_command(f"rm -f {path}")


@pytest.mark.sandbox
async def test_text_files_and_directories(client: ComputerServerClient) -> None:
    root = f"/tmp/{desktop.unique('dir')}"
    await client.make_dir(f"{root}/a/b")
    await client.write_text(f"{root}/a/b/t.txt", "héllo\nwörld ✓\n")
    assert await client.read_text(f"{root}/a/b/t.txt") == "héllo\nwörld ✓\n"
    assert (await sh(client, f"cat {root}/a/b/t.txt")) == "héllo\nwörld ✓\n"
    assert await client.file_exists(f"{root}/a/b/t.txt")
    assert not await client.file_exists(f"{root}/a/b")
    assert await client.dir_exists(f"{root}/a/b")
    assert await client.list_dir(f"{root}/a/b") == ["t.txt"]
    with pytest.raises(ComputerServerError) as err:
        await client.read_text(f"{root}/missing.txt")
    assert err.value.command == "read_text"
    assert "missing.txt" in str(err.value)
    assert "\n" not in str(err.value)
    await client.run_command(f"rm -rf {root}")


@pytest.mark.sandbox
async def test_screenshot_is_a_png_of_the_screen_size(client: ComputerServerClient) -> None:
    png = await client.screenshot()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == await client.screen_size()
    geometry = (await sh(client, "xdotool getdisplaygeometry")).split()
    assert (width, height) == (int(geometry[0]), int(geometry[1]))


@pytest.mark.sandbox
async def test_clipboard_roundtrip(client: ComputerServerClient) -> None:
    text = f"clip-ü-{desktop.unique('x')}"
    await client.set_clipboard(text)
    assert await client.get_clipboard() == text
    assert await sh(client, "xclip -o -selection clipboard") == text
    other = desktop.unique("from-xclip")
    # xclip -i can return before the X server names its background copy the owner (a CI run under load read the
    # previous text right after it). Wait until X says so, then ask the server.
    await sh(
        client,
        f"printf %s {other} | xclip -i -selection clipboard >/dev/null 2>&1; "
        f"timeout 20 sh -c 'until [ \"$(xclip -o -selection clipboard)\" = {other} ]; do sleep 0.05; done'",
    )
    assert await client.get_clipboard() == other


async def read_until(client: ComputerServerClient, pid: int, needle: bytes, timeout: float = 15) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout
    while needle not in out:
        assert time.monotonic() < deadline, f"{needle!r} not seen in PTY output {out!r}"
        chunk = await client.pty_read(pid, timeout_ms=1000)
        out += chunk.data
        if chunk.exited:
            break
    return out


async def wait_for_process(client: ComputerServerClient, pattern: str, timeout: float = 15) -> None:
    """Until a process whose command line matches ``pattern`` (``pgrep -f``) runs in the sandbox."""
    deadline = time.monotonic() + timeout
    while not (await sh(client, f"pgrep -f '{pattern}' || true")).strip():
        assert time.monotonic() < deadline, f"no process matching {pattern!r} within {timeout} s"
        await anyio.sleep(0.05)  # poll interval of a condition, not a guess at readiness


@pytest.mark.sandbox
async def test_pty_interactive_program_exits_with_its_code(client: ComputerServerClient) -> None:
    script = 'printf "name? "; read n; echo "hello $n"; exit 7'
    pid = await client.pty_start(f"sh -c {shlex.quote(script)}")
    assert await read_until(client, pid, b"name? ") == b"name? "  # the first bytes are not lost
    await client.pty_write(pid, b"bob\n")
    out = b""
    while True:
        chunk = await client.pty_read(pid, timeout_ms=5000)
        out += chunk.data
        if chunk.exited:
            break
    assert b"hello bob" in out
    assert chunk.exit_code == 7
    assert await client.pty_kill(pid) in (True, False)


@pytest.mark.sandbox
async def test_a_clients_command_env_reaches_its_shell_commands_and_ptys(
    computer_server_endpoint: Endpoint,
) -> None:
    """The environment a client is made with (a unit's egress proxy variables: ``SandboxHandle.command_env``)
    is what every command it starts sees, quoted whatever it holds; a client made without one adds nothing."""
    value = "http://127.0.0.1:4011 'quoted' $HOME"
    async with computer_server_endpoint.client(env={"ALE_CMD_ENV": value}) as with_env:
        assert await sh(with_env, 'printf %s "$ALE_CMD_ENV"') == value
        pid = await with_env.pty_start('sh -c \'printf "[%s]" "$ALE_CMD_ENV"\'')
        out = b""
        while not (chunk := await with_env.pty_read(pid, timeout_ms=5000)).exited:
            out += chunk.data
        assert f"[{value}]".encode() in out + chunk.data
    async with computer_server_endpoint.client() as plain:
        assert await sh(plain, 'printf %s "${ALE_CMD_ENV-unset}"') == "unset"
    with pytest.raises(ValueError, match="not an environment variable's name"):
        ComputerServerClient("http://sandbox.invalid:1", env={"A;B": "x"})


@pytest.mark.sandbox
async def test_pty_bash_session_resize_and_ctrl_c(client: ComputerServerClient) -> None:
    pid = await client.pty_start(cols=90, rows=20, env={"ALE_PTY_TEST": "yes"}, cwd="/tmp")
    try:
        await client.pty_write(pid, b"echo $((6*7)) $ALE_PTY_TEST $PWD\n")
        assert b"42 yes /tmp" in await read_until(client, pid, b"42 yes /tmp")
        await client.pty_resize(pid, 120, 33)
        await client.pty_write(pid, b"stty size\n")
        assert b"33 120" in await read_until(client, pid, b"33 120")
        await client.pty_write(pid, b"sleep 61.25; echo not-interrupted\n")
        # Only once sleep runs is it the terminal's foreground job: a ^C sent while bash is still between
        # reading the line and starting it reaches bash, and sleep then runs its whole minute.
        await wait_for_process(client, "^sleep 61[.]25$")
        await client.pty_write(pid, b"\x03")  # the PTY is the controlling terminal: ^C reaches sleep
        await client.pty_write(pid, b"echo after-$((1+1))\n")
        out = await read_until(client, pid, b"after-2")
        assert b"\nnot-interrupted" not in out  # only the echo of the command line, not its output
    finally:
        assert await client.pty_kill(pid)
    with pytest.raises(ComputerServerError, match="no PTY session"):
        await client.pty_read(pid)


@pytest.mark.sandbox
async def test_mouse_click_focus_and_typed_text_arrive(client: ComputerServerClient) -> None:
    screen = await client.screen_size()
    typed = f"/tmp/{desktop.unique('typed')}"
    first_title, second_title = desktop.unique("first"), desktop.unique("second")
    first = desktop.parse_window(
        first_title, await sh(client, desktop.open_xterm(first_title, f'read x; echo "$x" > {typed}', "50x5+30+30"))
    )
    second = desktop.parse_window(
        second_title, await sh(client, desktop.open_xterm(second_title, "read x", "50x5+500+300"))
    )
    try:
        await client.move_cursor(*second.center)
        assert await client.cursor_position() == second.center
        location = await sh(client, "xdotool getmouselocation --shell")
        assert f"X={second.center[0]}" in location and f"Y={second.center[1]}" in location
        await client.click(*second.center)
        assert (await sh(client, desktop.wait_focus(second.wid))).strip() == second.wid
        await client.click(*first.center)
        assert (await sh(client, desktop.wait_focus(first.wid))).strip() == first.wid
        await client.type_text("héllo world")
        await client.press_key("Return")
        assert (await sh(client, desktop.wait_file(typed))) == "héllo world\n"
        assert screen[0] > first.center[0] and screen[1] > first.center[1]
    finally:
        await client.run_command(
            f"{desktop.close_window(first.wid)}; {desktop.close_window(second.wid)}; rm -f {typed}"
        )


class SlowTransport(httpx.AsyncBaseTransport):
    """Every request held back ``delay`` seconds before it is sent: the round trips of a loaded host, for certain."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await anyio.sleep(self.delay)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.sandbox
async def test_a_triple_click_is_one_gesture_however_slow_the_requests(
    client: ComputerServerClient, computer_server_endpoint: Endpoint
) -> None:
    """A triple click selects xterm's line even when every request to the server takes longer than xterm's
    multi-click window (250 ms): the clicks are not one request each, which a loaded host spreads apart."""
    title = desktop.unique("lines")
    window = desktop.parse_window(
        title, await sh(client, desktop.open_xterm(title, "printf 'first\\nsecond line words\\n'; read x"))
    )
    try:
        # What stays in the selection if no line is selected:
        await sh(client, "printf sentinel | xclip -selection primary >/dev/null 2>&1")
        width, height = (window.width - 4) / 60, (window.height - 4) / 8  # the xterm is 60x8 cells
        x, y = round(window.x + 2 + 3.5 * width), round(window.y + 2 + 1.5 * height)  # "second", 4th letter
        async with computer_server_endpoint.client(transport=SlowTransport(0.3)) as slow:
            await slow.click(x, y, clicks=3)
        assert (await sh(client, "xclip -o -selection primary")).rstrip("\n") == "second line words"
    finally:
        await client.run_command(desktop.close_window(window.wid))


@pytest.mark.sandbox
async def test_errors_are_one_line_and_name_the_command(client: ComputerServerClient) -> None:
    with pytest.raises(ComputerServerError) as err:
        await client._cmd("no_such_command")  # the only way to make a real server answer HTTP 400
    assert "HTTP 400" in str(err.value) and "no_such_command" in str(err.value)
    with pytest.raises(UnknownKeyError):
        await client.press_key("definitely_not_a_key")
    with pytest.raises(ValueError, match="clicks"):
        await client.click(1, 1, clicks=4)
    with pytest.raises(ValueError, match="button"):
        await client.mouse_down("side")  # type: ignore[arg-type]
    assert (await client.run_command("echo still-fine")).stdout == "still-fine\n"


async def test_unreachable_server() -> None:
    async with ComputerServerClient("http://127.0.0.1:9", connect_timeout=1) as c:
        with pytest.raises(ServerUnreachableError, match=r"127\.0\.0\.1:9"):
            await c.status()


def test_key_names_normalize() -> None:
    assert [normalize_key(k) for k in ("Return", "ArrowUp", "Control", "PageDown", "F12", "A", " ", "esc")] == [
        "enter", "up", "ctrl", "page_down", "f12", "a", "space", "esc",
    ]  # fmt: skip
    assert normalize_keys(["ctrl+shift+t"]) == ["ctrl", "shift", "t"]
    assert normalize_keys(["ctrl++"]) == ["ctrl", "+"]
    assert normalize_keys(["+"]) == ["+"]
    for bad in ("notakey", "ctrl+", "", "f99"):
        with pytest.raises(UnknownKeyError):
            normalize_keys([bad])


# -- protocol edge cases, against a fake transport ---------------------------------------------------------


def fake(handler: Callable[[httpx.Request], httpx.Response], request_tries: int = 3) -> ComputerServerClient:
    return ComputerServerClient(
        "http://sandbox.invalid:1", transport=httpx.MockTransport(handler), request_tries=request_tries
    )


def reply(payload: dict[str, object]) -> httpx.Response:
    return httpx.Response(200, text=f"data: {json.dumps(payload)}\n\n")


@pytest.mark.parametrize("package,protocol", [("0.1.25", 1), ("0.4.0", 1), ("0.3.46", 2), ("unknown", 1)])
async def test_fake_server_unknown_version_is_refused(package: str, protocol: int) -> None:
    async with fake(lambda _: reply({"success": True, "package": package, "protocol": protocol})) as c:
        with pytest.raises(UnsupportedServerError) as err:
            await c.check_version()
    message = str(err.value)
    assert "sandbox.invalid" in message and package in message and "0.3.x" in message
    assert err.value.version == ServerVersion(package, protocol)


async def test_fake_server_malformed_replies_raise() -> None:
    bodies = [httpx.Response(200, text='{"success": true}'), httpx.Response(200, text="data: not json\n\n")]
    for body in bodies:

        def canned(_: httpx.Request, answer: httpx.Response = body) -> httpx.Response:
            return answer

        async with fake(canned) as c:
            with pytest.raises(ComputerServerError, match="reply"):
                await c.version()
    async with fake(lambda _: reply({"success": False, "error": "boom\nsecond line"})) as c:
        with pytest.raises(ComputerServerError, match="boom second line"):
            await c.move_cursor(1, 1)


async def test_fake_server_only_reads_are_retried() -> None:
    calls: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content)["command"])
        if len(calls) == 1:
            raise httpx.ReadError("connection reset", request=request)
        return reply({"success": True, "content": "ok", "stdout": "", "stderr": "", "return_code": 0})

    async with fake(flaky) as c:
        assert await c.read_text("/x") == "ok"
        assert calls == ["read_text", "read_text"]
        calls.clear()
        with pytest.raises(ServerUnreachableError, match="run_command"):
            await c.run_command("rm -rf /tmp/once")
        assert calls == ["run_command"]


async def test_fake_server_a_client_of_one_try_gives_up_at_the_first_broken_connection() -> None:
    calls: list[str] = []

    def refused(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        raise httpx.ConnectError("connection refused", request=request)

    async with fake(refused, request_tries=1) as c:
        with pytest.raises(ServerUnreachableError, match="status"):
            await c.status()
    assert calls == ["/status"]
    async with fake(refused) as c:
        with pytest.raises(ServerUnreachableError, match="status"):
            await c.status()
    assert calls == ["/status"] * 4
    with pytest.raises(ValueError, match="request_tries"):
        ComputerServerClient("http://127.0.0.1:1", request_tries=0)


async def test_fake_server_set_clipboard_returns_once_the_clipboard_holds_the_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """xclip's reply comes before its child owns the selection: the first reads still see the old text."""
    reads: list[str] = []

    def lagging(request: httpx.Request, stale_reads: int) -> httpx.Response:
        body = json.loads(request.content)
        if body["command"] == "set_clipboard":
            return reply({"success": True})
        assert body["command"] == "copy_to_clipboard"
        reads.append("stale" if len(reads) < stale_reads else "new")
        return reply({"success": True, "content": "old text" if reads[-1] == "stale" else "<hello>"})

    async with fake(lambda request: lagging(request, stale_reads=3)) as c:
        await c.set_clipboard("<hello>")
    assert reads == ["stale", "stale", "stale", "new"]

    reads.clear()
    monkeypatch.setattr(client_module, "CLIPBOARD_SETTLE_S", 0.2)
    async with fake(lambda request: lagging(request, stale_reads=10**6)) as c:
        with pytest.raises(ComputerServerError, match="the clipboard does not hold the text written"):
            await c.set_clipboard("<hello>")
