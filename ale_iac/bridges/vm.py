"""The vm bridge: CLI and system primitives of a sandbox over MCP.

One-shot shell, text and binary files, the clipboard, and persistent PTY sessions. Tool names, parameters,
defaults and return texts are the contract of the MCP tools specification (listed in docs/bridges.md and
encoded as data in tests/bridges/); agents and prompts are written against them, so they change only with it.
"""

from __future__ import annotations

import base64
import binascii
import codecs
from typing import Annotated

from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from ale_iac.bridges.common import BridgeServer, BridgeState, ClientFactory, failing, make_tool
from ale_iac.sandbox.protocol import PtyOutput

OVERFLOW_NOTE = "[earlier output dropped — buffer overflow]\n"

INSTRUCTIONS = (
    "Shell, files, clipboard and terminal sessions of one sandbox. run_command is one-shot (no state kept "
    "between calls); use pty_* for interactive or long-running programs. For the screen, mouse and keyboard "
    "use the cua bridge."
)


class RunCommandOutput(BaseModel):
    exit_code: int = Field(description="The command's exit status; -1 if it was killed at its timeout.")
    stdout: str
    stderr: str


FilePath = Annotated[str, Field(description="Absolute path in the sandbox (a leading ~ is the user's home).")]
Pid = Annotated[int, Field(description="PTY session id returned by pty_start.")]
Cols = Annotated[int, Field(ge=1, le=10000, description="Terminal width in columns.")]
Rows = Annotated[int, Field(ge=1, le=10000, description="Terminal height in rows.")]


def format_run_command(exit_code: int, stdout: str, stderr: str) -> str:
    """``exit_code: N``, then ``stdout:`` and its text, then ``stderr:`` and its text when there is any."""
    parts = [f"exit_code: {exit_code}", f"stdout:\n{stdout}"]
    if stderr:
        parts.append(f"stderr:\n{stderr}")
    return "\n".join(parts)


def format_pty_output(text: str, out: PtyOutput) -> str:
    """A pty_read's text, after a note when output was dropped, tagged ``[running]`` or ``[exited, code N]``."""
    head = OVERFLOW_NOTE if out.dropped else ""
    tail = f"[exited, code {out.exit_code}]" if out.exited else "[running]"
    separator = "" if not text or text.endswith("\n") else "\n"
    return f"{head}{text}{separator}{tail}"


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode_b64(value: str, argument: str) -> bytes:
    """Strict base64 (whitespace such as line breaks is ignored); a ``ToolError`` naming ``argument``."""
    compact = "".join(value.split())
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ToolError(f"{argument} is not valid base64: {exc}") from exc


def build_server(client_factory: ClientFactory) -> BridgeServer:
    """The vm bridge over the computer-server that ``client_factory`` connects to."""
    state = BridgeState(client_factory)
    ptys = _PtyDecoders()
    tools = [
        *_command_tools(state),
        *_file_tools(state),
        *_clipboard_tools(state),
        *_pty_io_tools(state, ptys),
        *_pty_control_tools(state, ptys),
    ]
    return BridgeServer("ale-iac-vm", INSTRUCTIONS, tools)


def _command_tools(state: BridgeState) -> list[Tool]:
    """The one-shot shell: run_command."""

    async def run_command(
        command: Annotated[str, Field(description="Shell command line (run by the sandbox's /bin/sh -c).")],
        timeout: Annotated[
            float | None,
            Field(gt=0, description="Seconds after which the command is killed (exit_code -1). Default: none."),
        ] = None,
    ) -> Annotated[CallToolResult, RunCommandOutput]:
        async with failing(f"running {_clip(command)!r}"):
            result = await (await state.client()).run_command(command, timeout=timeout)
        return CallToolResult(
            content=[TextContent(type="text", text=format_run_command(result.exit_code, result.stdout, result.stderr))],
            structured_content={"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr},
        )

    return [
        make_tool(
            run_command,
            "run_command",
            "Run a shell command in the sandbox and wait for it to finish. One-shot and blocking: no shell state "
            "(cwd, variables) persists between calls, so write `cd /dir && cmd` or `VAR=x cmd`. Returns the exit "
            "code, stdout and stderr. For interactive or long-running programs use the pty_* tools.",
            structured=True,
        )
    ]


def _file_tools(state: BridgeState) -> list[Tool]:
    """Text and binary files: read_text, write_text, read_bytes and write_bytes."""

    async def read_text(path: FilePath) -> str:
        async with failing(f"cannot read {path}"):
            return await (await state.client()).read_text(path)

    async def write_text(path: FilePath, content: Annotated[str, Field(description="The text to write.")]) -> str:
        async with failing(f"cannot write {path}"):
            await (await state.client()).write_text(path, content)
        return f"Wrote {len(content.encode('utf-8'))} bytes to {path}"

    async def read_bytes(
        path: FilePath,
        offset: Annotated[int, Field(ge=0, description="Byte offset to start at.")] = 0,
        length: Annotated[int | None, Field(ge=0, description="Bytes to read. Default: to the end.")] = None,
    ) -> str:
        async with failing(f"cannot read {path}"):
            data = await (await state.client()).read_bytes(path, offset=offset, length=length)
        return base64.b64encode(data).decode("ascii")

    async def write_bytes(
        path: FilePath,
        content_b64: Annotated[str, Field(description="The bytes to write, base64-encoded.")],
        append: Annotated[bool, Field(description="Append instead of overwriting.")] = False,
    ) -> str:
        data = decode_b64(content_b64, "content_b64")
        async with failing(f"cannot write {path}"):
            await (await state.client()).write_bytes(path, data, append=append)
        return f"Wrote bytes to {path}"

    return [
        make_tool(read_text, "read_text", "Read a UTF-8 text file and return its full contents."),
        make_tool(
            write_text,
            "write_text",
            "Write UTF-8 text to a file, replacing what was there (the file is created if missing; its "
            "directory must exist). Use write_bytes for binary data or to append.",
        ),
        make_tool(
            read_bytes,
            "read_bytes",
            "Read raw bytes from a file, base64-encoded. Use offset and length to read a range of a large file.",
        ),
        make_tool(
            write_bytes,
            "write_bytes",
            "Write raw bytes (given base64-encoded) to a file, replacing it, or appending with append=true.",
        ),
    ]


def _clipboard_tools(state: BridgeState) -> list[Tool]:
    """The desktop's clipboard: read_clipboard and write_clipboard."""

    async def read_clipboard() -> str:
        async with failing("cannot read the clipboard"):
            return await (await state.client()).get_clipboard()

    async def write_clipboard(text: Annotated[str, Field(description="Text to put on the clipboard.")]) -> str:
        async with failing("cannot set the clipboard"):
            await (await state.client()).set_clipboard(text)
        return f"Set clipboard ({len(text.encode('utf-8'))} bytes)"

    return [
        make_tool(read_clipboard, "read_clipboard", "Return the text on the sandbox desktop's clipboard."),
        make_tool(write_clipboard, "write_clipboard", "Put text on the sandbox desktop's clipboard."),
    ]


class _PtyDecoders:
    """Per PTY session, the UTF-8 decoder of its output: a character split between two reads comes out whole."""

    def __init__(self) -> None:
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}

    def start(self, pid: int) -> None:
        self._decoders[pid] = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, pid: int, data: bytes, *, final: bool) -> str:
        decoder = self._decoders.setdefault(pid, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        return decoder.decode(data, final=final)

    def forget(self, pid: int) -> None:
        self._decoders.pop(pid, None)


async def _known_pty(state: BridgeState, pid: int) -> None:
    client = await state.client()
    if pid not in client.pty_sessions():
        raise ToolError(f"No PTY session with pid {pid}")


def _pty_io_tools(state: BridgeState, ptys: _PtyDecoders) -> list[Tool]:
    """A terminal's program and its input and output: pty_start, pty_input and pty_read."""

    async def pty_start(
        command: Annotated[str, Field(description="Program or shell command line to run in the terminal.")] = "bash",
        cwd: Annotated[str | None, Field(description="Working directory. Default: the server's.")] = None,
        env: Annotated[dict[str, str] | None, Field(description="Extra environment variables.")] = None,
        cols: Cols = 80,
        rows: Rows = 24,
    ) -> str:
        async with failing(f"cannot start {_clip(command)!r} in a PTY"):
            pid = await (await state.client()).pty_start(command, cwd=cwd, env=env, cols=cols, rows=rows)
        ptys.start(pid)
        return f"pid: {pid}\ncols: {cols}\nrows: {rows}"

    async def pty_input(
        pid: Pid,
        data: Annotated[str, Field(description="Raw input: include \\n to submit a line; \\u0003 is ctrl-c.")],
    ) -> str:
        await _known_pty(state, pid)
        raw = data.encode("utf-8")
        async with failing(f"cannot write to PTY {pid}"):
            await (await state.client()).pty_write(pid, raw)
        return f"Sent {len(raw)} bytes to pid {pid}"

    async def pty_read(
        pid: Pid,
        timeout_ms: Annotated[
            int, Field(ge=0, le=600_000, description="How long to wait for output when none is buffered.")
        ] = 2000,
    ) -> str:
        await _known_pty(state, pid)
        async with failing(f"cannot read PTY {pid}"):
            out = await (await state.client()).pty_read(pid, timeout_ms=timeout_ms)
        return format_pty_output(ptys.decode(pid, out.data, final=out.exited), out)

    return [
        make_tool(
            pty_start,
            "pty_start",
            "Start a program in a persistent pseudo-terminal (default: an interactive bash). Returns its pid for "
            "pty_input, pty_read, pty_resize and pty_kill. Everything it prints is buffered for pty_read.",
        ),
        make_tool(
            pty_input,
            "pty_input",
            "Send raw input to a PTY session: text, \\n to submit a line, control characters such as \\u0003 "
            "(ctrl-c) or \\u0004 (ctrl-d). Read the response with pty_read.",
        ),
        make_tool(
            pty_read,
            "pty_read",
            "Return the output a PTY session printed since the last read (raw terminal bytes, may contain ANSI "
            "escapes), tagged [running] or [exited, code N]. If nothing is buffered, waits up to timeout_ms for "
            "output or the exit.",
        ),
    ]


def _pty_control_tools(state: BridgeState, ptys: _PtyDecoders) -> list[Tool]:
    """A terminal's size and end: pty_resize and pty_kill."""

    async def pty_resize(pid: Pid, cols: Cols, rows: Rows) -> str:
        await _known_pty(state, pid)
        async with failing(f"cannot resize PTY {pid}"):
            await (await state.client()).pty_resize(pid, cols, rows)
        return f"Resized pid {pid} to {cols}x{rows}"

    async def pty_kill(pid: Pid) -> str:
        await _known_pty(state, pid)
        ptys.forget(pid)
        async with failing(f"cannot kill PTY {pid}"):
            await (await state.client()).pty_kill(pid)
        return f"Killed pid {pid}"

    return [
        make_tool(pty_resize, "pty_resize", "Resize a PTY session's terminal."),
        make_tool(pty_kill, "pty_kill", "Kill a PTY session's process and forget the session."),
    ]
