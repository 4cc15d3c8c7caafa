"""The thick tools, built only on the two MCP bridges: exec, read, write, edit, clipboard, computer, terminal.

Each tool turns one model call into one or more bridge calls and returns a :class:`ToolOutcome`; a
failure the model can act on (a bridge's tool error, a bad argument, a string ``edit`` cannot find) is an
outcome with ``is_error``, never an exception, so the loop goes on. Long outputs are paged here, on the
harness's side: the full text stays in the harness's memory and the marker says how to get the rest.

Recovery: a bridge found dead is restarted. A call is retried once only when sending it twice is
harmless (reads, screenshots, writing the same content); for the rest (a command, a click, a key) the
bridge is pinged first, so a bridge that died while idle is restarted *before* the call is sent, and a
bridge that dies during the call is restarted but the call is not retried: the model is told it may
have taken effect.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ale_iac.agent_sdk import BridgeKind

if TYPE_CHECKING:  # annotations only: the deployer loads the sibling modules by file
    from agents.ale_claw.bridges import Bridge, RawResult

SAFE_TO_RETRY: Final = frozenset(
    {
        ("vm", "read_text"),
        ("vm", "read_bytes"),
        ("vm", "write_text"),
        ("vm", "read_clipboard"),
        ("vm", "write_clipboard"),
        ("cua", "screenshot"),
        ("cua", "cursor_position"),
        ("cua", "get_screen_size"),
        ("cua", "mouse_move"),
    }
)
"""Bridge calls whose second sending changes nothing the first did not: retried once after a restart."""

BINARY_SNIFF = 8192
READ_MAX_BYTES = 4 * 1024 * 1024
COORDINATE: Final = {
    "type": "array",
    "items": {"type": "number", "minimum": 0, "maximum": 1000},
    "minItems": 2,
    "maxItems": 2,
}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    schema: dict[str, Any]


@dataclass
class ToolOutcome:
    text: str
    is_error: bool = False
    images: list[tuple[bytes, str]] = field(default_factory=list)
    """(PNG/JPEG bytes, MIME type): screenshots, shown to the model and saved as files."""
    extra: dict[str, Any] = field(default_factory=dict)


class ToolError(Exception):
    """Ends one tool call with an error outcome (the message is what the model sees)."""


class BridgeCaller:
    """Bridge calls with the recovery policy; records each call and each restart in ``log``."""

    def __init__(self, bridges: dict[BridgeKind, Bridge], timeout_s: float, died: type[Exception]) -> None:
        self.bridges = bridges
        self.timeout_s = timeout_s
        self.died = died
        """The exception a bridge raises when its process is gone (``bridges.BridgeDiedError``)."""
        self.log: list[dict[str, Any]] = []

    async def __call__(
        self, kind: BridgeKind, tool: str, args: dict[str, Any], timeout_s: float | None = None
    ) -> RawResult:
        bridge = self.bridges[kind]
        died = self.died
        timeout = timeout_s or self.timeout_s
        safe = (kind, tool) in SAFE_TO_RETRY
        if not safe and not await bridge.alive():
            await self._restart(kind, tool, "found dead before the call")
        try:
            result = await bridge.call(tool, args, timeout)
        except died as exc:
            await self._restart(kind, tool, str(exc))
            if not safe:
                raise ToolError(
                    f"the {kind} bridge died during {tool} and was restarted; {tool} was NOT retried because it "
                    "may already have taken effect: check the state before doing it again"
                ) from exc
            try:
                result = await bridge.call(tool, args, timeout)
            except died as again:
                await self._restart(kind, tool, str(again))
                raise ToolError(f"the {kind} bridge died twice during {tool} (restarted): {again}") from again
            self.log.append({"bridge": kind, "tool": tool, "retried": True, "duration_s": round(result.duration_s, 4)})
            return result
        self.log.append({"bridge": kind, "tool": tool, "duration_s": round(result.duration_s, 4)})
        return result

    async def _restart(self, kind: BridgeKind, tool: str, reason: str) -> None:
        await self.bridges[kind].restart()
        self.log.append({"bridge": kind, "tool": tool, "restarted": True, "reason": reason})

    def take_log(self) -> list[dict[str, Any]]:
        log, self.log = self.log, []
        return log


# -- paging ---------------------------------------------------------------------------------------------


def page_of(text: str, page: int, page_chars: int) -> tuple[str, int]:
    """Page ``page`` (1-based) of ``text`` cut at line ends where it can, and how many pages there are."""
    pages = _pages(text, page_chars)
    return pages[min(max(page, 1), len(pages)) - 1], len(pages)


def _pages(text: str, page_chars: int) -> list[str]:
    pages: list[str] = []
    rest = text
    while len(rest) > page_chars:
        cut = rest.rfind("\n", page_chars // 2, page_chars)
        cut = cut + 1 if cut > 0 else page_chars
        pages.append(rest[:cut])
        rest = rest[cut:]
    pages.append(rest)
    return pages


def truncate_middle(text: str, limit: int, hint: str) -> str:
    """``text`` cut to about ``limit`` characters, keeping its head and tail, with a marker in between."""
    if len(text) <= limit:
        return text
    head = text[: limit * 2 // 3]
    tail = text[-(limit // 3) :]
    cut = len(text) - len(head) - len(tail)
    return f"{head}\n[... {cut} characters truncated; {hint} ...]\n{tail}"


# -- the tools ------------------------------------------------------------------------------------------


class Toolbox:
    """The model's tools over a :class:`BridgeCaller`."""

    def __init__(
        self,
        call: BridgeCaller,
        *,
        page_chars: int,
        exec_timeout_s: float,
        max_exec_timeout_s: float,
        read_lines: int,
        generation: Callable[[BridgeKind], int],
    ) -> None:
        self.call = call
        self.page_chars = page_chars
        self.exec_timeout_s = exec_timeout_s
        self.max_exec_timeout_s = max_exec_timeout_s
        self.read_lines = read_lines
        self._generation = generation
        self.outputs: dict[str, str] = {}
        """Full outputs of exec calls, by id: paged from here, never re-run."""
        self.terminals: dict[int, tuple[int, int]] = {}
        """Open terminals: session number -> (PTY pid, the vm bridge generation that started it)."""
        self._sessions = 0
        self._handlers: dict[str, Callable[[dict[str, Any]], Awaitable[ToolOutcome]]] = {
            "exec": self.exec,
            "read": self.read,
            "write": self.write,
            "edit": self.edit,
            "clipboard": self.clipboard,
            "computer": self.computer,
            "terminal": self.terminal,
        }

    @staticmethod
    def specs(gui: bool = True) -> list[ToolSpec]:
        """The tools the model gets, in this order; ``computer`` only with a desktop (``gui``)."""
        specs = [_exec_spec(), _read_spec(), _write_spec(), _edit_spec(), _clipboard_spec(), _terminal_spec()]
        return [*specs, _computer_spec()] if gui else specs

    @staticmethod
    def error(text: str) -> ToolOutcome:
        return ToolOutcome(text, is_error=True)

    async def run(self, name: str, arguments: dict[str, Any]) -> ToolOutcome:
        handler = self._handlers.get(name)
        if handler is None:
            return ToolOutcome(f"unknown tool {name!r} (tools: {', '.join(self._handlers)})", is_error=True)
        try:
            outcome = await handler(arguments)
        except ToolError as exc:
            outcome = ToolOutcome(str(exc), is_error=True)
        except (KeyError, TypeError, ValueError) as exc:
            outcome = ToolOutcome(f"bad arguments for {name}: {type(exc).__name__}: {exc}", is_error=True)
        bridge_calls = self.call.take_log()
        if bridge_calls:
            outcome.extra["bridge_calls"] = bridge_calls
        return outcome

    # exec

    async def exec(self, args: dict[str, Any]) -> ToolOutcome:
        page = int(args.get("page") or 1)
        if args.get("output_id"):
            output_id = str(args["output_id"])
            if output_id not in self.outputs:
                raise ToolError(f"no output {output_id!r} (known: {', '.join(self.outputs) or 'none'})")
            return self._page(output_id, page)
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("exec needs a command (or output_id and page to page an earlier output)")
        timeout = min(float(args.get("timeout") or self.exec_timeout_s), self.max_exec_timeout_s)
        result = await self.call("vm", "run_command", {"command": command, "timeout": timeout}, timeout + 30)
        if result.is_error:
            return ToolOutcome(result.text, is_error=True)
        data = result.structured or {}
        code = data.get("exit_code")
        text = f"exit_code: {code}" + (" (killed: timed out)" if code == -1 else "")
        text += f"\nstdout:\n{data.get('stdout', '')}"
        if data.get("stderr"):
            text += f"\nstderr:\n{data['stderr']}"
        if not data:
            text = result.text
        output_id = f"out-{len(self.outputs) + 1}"
        self.outputs[output_id] = text
        outcome = self._page(output_id, page)
        outcome.extra["exit_code"] = code
        return outcome

    def _page(self, output_id: str, page: int) -> ToolOutcome:
        full = self.outputs[output_id]
        text, pages = page_of(full, page, self.page_chars)
        page = min(max(page, 1), pages)
        if pages > 1:
            marker = f"[output {output_id}: page {page} of {pages}, {len(full)} characters in all"
            if page < pages:
                marker += f'; the rest: exec with {{"output_id": "{output_id}", "page": {page + 1}}}'
            text = text.rstrip("\n") + "\n" + marker + "]"
        return ToolOutcome(text, extra={"output_id": output_id, "page": page, "pages": pages})

    # files

    async def read(self, args: dict[str, Any]) -> ToolOutcome:
        path = str(args["path"])
        offset = max(int(args.get("offset") or 1), 1)
        limit = max(int(args.get("limit") or self.read_lines), 1)
        result = await self.call("vm", "read_bytes", {"path": path, "offset": 0, "length": READ_MAX_BYTES + 1})
        if result.is_error:
            return ToolOutcome(result.text, is_error=True)
        data = _b64(result)
        clipped = len(data) > READ_MAX_BYTES
        data = data[:READ_MAX_BYTES]
        kind = binary_kind(data)
        if kind is not None:
            raise ToolError(
                f"{path} is a binary file ({kind}, {len(data)}{'+' if clipped else ''} bytes): not shown as text; "
                "use exec (e.g. `file`, `xxd | head`) to inspect it"
            )
        text = data.decode("utf-8", errors="replace")
        lines = text.splitlines()
        chosen = lines[offset - 1 : offset - 1 + limit]
        if not lines:
            return ToolOutcome(f"{path} is empty")
        if not chosen:
            raise ToolError(f"{path} has {len(lines)} lines; offset {offset} is past the end")
        width = len(str(offset + len(chosen) - 1))
        body = "\n".join(f"{n:>{width}}\t{line}" for n, line in enumerate(chosen, start=offset))
        body = truncate_middle(body, self.page_chars, "read a smaller line range to see it")
        last = offset + len(chosen) - 1
        if last < len(lines) or clipped:
            total = f"{len(lines)}{'+' if clipped else ''}"
            body += f"\n[lines {offset}-{last} of {total}; the rest: read with offset={last + 1}]"
        return ToolOutcome(body, extra={"lines": [offset, last]})

    async def write(self, args: dict[str, Any]) -> ToolOutcome:
        path, content = str(args["path"]), str(args["content"])
        result = await self.call("vm", "write_text", {"path": path, "content": content})
        if result.is_error and "No such file or directory" in result.text and "/" in path.rstrip("/"):
            folder = path.rstrip("/").rsplit("/", 1)[0] or "/"
            await self.call("vm", "run_command", {"command": f"mkdir -p {_quote(folder)}", "timeout": 30})
            result = await self.call("vm", "write_text", {"path": path, "content": content})
        if result.is_error:
            return ToolOutcome(result.text, is_error=True)
        return ToolOutcome(f"wrote {len(content.encode())} bytes to {path}")

    async def edit(self, args: dict[str, Any]) -> ToolOutcome:
        path, old, new = str(args["path"]), str(args["old_string"]), str(args["new_string"])
        if not old:
            raise ToolError("edit: old_string is empty; use write to create or replace a whole file")
        if old == new:
            raise ToolError("edit: old_string and new_string are the same; nothing to change")
        result = await self.call("vm", "read_text", {"path": path})
        if result.is_error:
            return ToolOutcome(result.text, is_error=True)
        text = result.text
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"edit: old_string was not found in {path}; nothing was changed (it must match exactly, "
                "whitespace and indentation included: read the file first)"
            )
        if count > 1 and not args.get("replace_all"):
            lines = _lines_of(text, old)
            raise ToolError(
                f"edit: old_string occurs {count} times in {path} (at lines {', '.join(map(str, lines))}); nothing "
                "was changed: include more context to make it unique, or set replace_all"
            )
        line = text[: text.index(old)].count("\n") + 1
        updated = text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1)
        written = await self.call("vm", "write_text", {"path": path, "content": updated})
        if written.is_error:
            return ToolOutcome(written.text, is_error=True)
        where = f"{count} occurrences" if count > 1 else f"1 occurrence at line {line}"
        return ToolOutcome(f"edited {path}: replaced {where}")

    async def clipboard(self, args: dict[str, Any]) -> ToolOutcome:
        if args["action"] == "read":
            result = await self.call("vm", "read_clipboard", {})
        elif args["action"] == "write":
            result = await self.call("vm", "write_clipboard", {"text": str(args["text"])})
        else:
            raise ToolError(f"clipboard: unknown action {args['action']!r} (read, write)")
        return ToolOutcome(result.text or ("(empty)" if not result.is_error else "failed"), is_error=result.is_error)

    # the desktop

    async def computer(self, args: dict[str, Any]) -> ToolOutcome:
        action = args["action"]
        mapping: dict[str, tuple[str, list[str]]] = {
            "screenshot": ("screenshot", []),
            "click": ("click", ["coordinate", "button", "clicks"]),
            "move": ("mouse_move", ["coordinate"]),
            "type": ("type", ["text"]),
            "key": ("key", ["keys"]),
            "scroll": ("scroll", ["direction", "amount", "coordinate"]),
            "drag": ("drag", ["coordinate", "start_coordinate", "button"]),
            "wait": ("wait", ["duration"]),
        }
        if action not in mapping:
            raise ToolError(f"computer: unknown action {action!r} (one of {', '.join(mapping)})")
        tool, names = mapping[action]
        bridge_args = {k: args[k] for k in names if args.get(k) is not None}
        if action == "scroll":
            bridge_args.setdefault("amount", 3)
        if action == "wait":
            bridge_args.setdefault("duration", 1)
        result = await self.call("cua", tool, bridge_args)
        images = []
        for data, mime in result.images:
            try:
                images.append((base64.b64decode(data, validate=True), mime))
            except (binascii.Error, ValueError):
                continue
        return ToolOutcome(result.text or f"{action}: done", is_error=result.is_error, images=images)

    # terminals

    async def terminal(self, args: dict[str, Any]) -> ToolOutcome:
        action = args["action"]
        timeout_ms = int(args.get("timeout_ms") or 2000)
        if action == "start":
            result = await self.call("vm", "pty_start", {"command": str(args.get("command") or "bash")})
            if result.is_error:
                return ToolOutcome(result.text, is_error=True)
            pid = int(result.text.split("pid:", 1)[1].split()[0])
            self._sessions += 1
            session = self._sessions
            self.terminals[session] = (pid, self._generation("vm"))
            first = await self.call("vm", "pty_read", {"pid": pid, "timeout_ms": timeout_ms}, timeout_ms / 1000 + 30)
            return ToolOutcome(f"session {session} started\n{first.text}", extra={"session": session, "pid": pid})
        session = int(args["session"])
        if session not in self.terminals:
            raise ToolError(f"no terminal session {session} (open: {', '.join(map(str, self.terminals)) or 'none'})")
        pid, generation = self.terminals[session]
        if generation != self._generation("vm"):
            del self.terminals[session]
            raise ToolError(f"terminal session {session} was lost when the vm bridge restarted; start a new one")
        if action == "send":
            sent = await self.call("vm", "pty_input", {"pid": pid, "data": str(args["input"])})
            if sent.is_error:
                return ToolOutcome(sent.text, is_error=True)
        elif action == "kill":
            killed = await self.call("vm", "pty_kill", {"pid": pid})
            self.terminals.pop(session, None)
            return ToolOutcome(killed.text or f"session {session} killed", is_error=killed.is_error)
        elif action != "read":
            raise ToolError(f"terminal: unknown action {action!r} (start, send, read, kill)")
        result = await self.call("vm", "pty_read", {"pid": pid, "timeout_ms": timeout_ms}, timeout_ms / 1000 + 30)
        text = truncate_middle(result.text, self.page_chars, "the terminal printed more than a page")
        return ToolOutcome(text, is_error=result.is_error)


# -- the tools' specs (name, description, JSON schema of the arguments) ---------------------------------


def _exec_spec() -> ToolSpec:
    return ToolSpec(
        "exec",
        "Run a shell command in the sandbox (/bin/sh -c; no state survives between calls) and wait for it. "
        "Returns the exit code, stdout and stderr. Long output is paged: the marker at the end of a page "
        "says how to get the next one (exec with output_id and page, which does not run anything again).",
        {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line."},
                "timeout": {"type": "number", "description": "Seconds before the command is killed."},
                "output_id": {"type": "string", "description": "Page an earlier output instead of running."},
                "page": {"type": "integer", "minimum": 1, "description": "Which page (1-based)."},
            },
        },
    )


def _read_spec() -> ToolSpec:
    return ToolSpec(
        "read",
        "Read a text file in the sandbox with line numbers: lines offset.. offset+limit-1. Binary files "
        "are detected and not dumped.",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Absolute path."},
                "offset": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
                "limit": {"type": "integer", "minimum": 1, "description": "How many lines."},
            },
            "required": ["path"],
        },
    )


def _write_spec() -> ToolSpec:
    return ToolSpec(
        "write",
        "Write a text file in the sandbox (replaces it; the folder is created if missing).",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    )


def _edit_spec() -> ToolSpec:
    return ToolSpec(
        "edit",
        "Replace an exact string in a text file. old_string must occur exactly once (or set replace_all).",
        {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"},
            },
            "required": ["path", "old_string", "new_string"],
        },
    )


def _clipboard_spec() -> ToolSpec:
    return ToolSpec(
        "clipboard",
        "Read or set the sandbox's clipboard.",
        {
            "type": "object",
            "properties": {"action": {"type": "string", "enum": ["read", "write"]}, "text": {"type": "string"}},
            "required": ["action"],
        },
    )


def _terminal_spec() -> ToolSpec:
    return ToolSpec(
        "terminal",
        "A long-running terminal (PTY) in the sandbox, for interactive programs. start (command) -> a "
        "session id; send (session, input; include \\n to submit, \\u0003 is ctrl-c) returns the output "
        "that follows; read (session) returns new output; kill (session).",
        {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": ["start", "send", "read", "kill"]},
                "session": {"type": "integer"},
                "command": {"type": "string"},
                "input": {"type": "string"},
                "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 600000},
            },
            "required": ["action"],
        },
    )


def _computer_spec() -> ToolSpec:
    return ToolSpec(
        "computer",
        "The desktop. Coordinates are [x, y] in [0, 1000] on both axes. action: screenshot; click "
        "(coordinate, button, clicks); move (coordinate); type (text, into the focused window); key "
        '(keys, e.g. ["ctrl", "s"]); scroll (direction, amount, coordinate); drag (start_coordinate, '
        "coordinate); wait (duration).",
        {
            "type": "object",
            "properties": {
                "action": {
                    "type": "string",
                    "enum": ["screenshot", "click", "move", "type", "key", "scroll", "drag", "wait"],
                },
                "coordinate": COORDINATE,
                "start_coordinate": COORDINATE,
                "button": {"type": "string", "enum": ["left", "right", "middle"]},
                "clicks": {"type": "integer", "enum": [1, 2, 3]},
                "text": {"type": "string"},
                "keys": {"type": "array", "items": {"type": "string"}},
                "direction": {"type": "string", "enum": ["up", "down", "left", "right"]},
                "amount": {"type": "integer", "minimum": 1},
                "duration": {"type": "number", "minimum": 0, "maximum": 60},
            },
            "required": ["action"],
        },
    )


def _b64(result: RawResult) -> bytes:
    try:
        return base64.b64decode(result.text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ToolError(f"read: the bridge sent bytes that are not base64: {exc}") from None


def binary_kind(data: bytes) -> str | None:
    """What kind of binary ``data`` is, or None for text (UTF-8, no NUL in its first 8 KiB)."""
    head = data[:BINARY_SNIFF]
    for magic, kind in (
        (b"\x89PNG", "PNG image"),
        (b"\xff\xd8\xff", "JPEG image"),
        (b"%PDF", "PDF"),
        (b"PK\x03\x04", "zip archive"),
        (b"\x7fELF", "ELF executable"),
        (b"\x1f\x8b", "gzip data"),
    ):
        if head.startswith(magic):
            return kind
    if b"\x00" in head:
        return "binary data"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the sniff's end
            return "binary data (not UTF-8)"
    return None


def _lines_of(text: str, needle: str) -> list[int]:
    lines: list[int] = []
    start = 0
    while (found := text.find(needle, start)) != -1 and len(lines) < 10:
        lines.append(text[:found].count("\n") + 1)
        start = found + 1
    return lines


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\"'\"'") + "'"
