"""The task SDK: what a task's ``main.py`` hooks receive and may import.

    async def setup(sandbox: TaskSandbox) -> None: ...
    async def evaluate(sandbox: TaskSandbox) -> float | Evaluation: ...   # a score in [0, 1]

``evaluate`` may return an :class:`Evaluation` instead of a bare number: the score plus details (partial
credit per criterion, say), kept in the unit's ``eval_result.json``. What hooks print or log goes into
the unit's ``hooks.log``, and an exception's traceback too.

``TaskSandbox`` is the sandbox plus the task's folders in it (``input_dir``, ``output_dir``,
``reference_dir``), with the calls tasks need: run a command, start a GUI program, read and write
files, take a screenshot.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.protocol import CommandResult

__all__ = ["Evaluation", "TaskSandbox", "shell_quote"]


@dataclass(frozen=True)
class Evaluation:
    """What ``evaluate`` may return instead of a bare score: the score in [0, 1] and JSON-able details,
    such as ``{"errors": {"credit": 1.0, "weight": 0.5}, ...}``."""

    score: float
    details: dict[str, Any] = field(default_factory=dict)


class TaskSandbox:
    """What ``setup`` and ``evaluate`` receive: the sandbox plus the task's paths inside it."""

    def __init__(
        self, handle: SandboxHandle, client: ComputerServerClient, task_id: str, task_dir: str | None = None
    ) -> None:
        """The task's folders are ``<task_data_root>/<task_id>/...`` unless ``task_dir`` says where;
        joined with the sandbox's separator (a backslash on Windows)."""
        self.handle = handle
        self.client = client
        sep = "\\" if handle.os == "windows" else "/"
        self.task_dir = task_dir or f"{handle.paths.task_data_root.rstrip(sep)}{sep}{task_id}"
        self.input_dir = f"{self.task_dir}{sep}input"
        self.output_dir = f"{self.task_dir}{sep}output"
        self.reference_dir = f"{self.task_dir}{sep}reference"

    async def run(self, command: str, timeout: float | None = 60) -> CommandResult:
        return await self.client.run_command(command, timeout=timeout)

    async def run_ok(self, command: str, timeout: float = 60) -> str:
        """Run ``command``; its stdout, or a RuntimeError with the exit code and the end of stderr."""
        result = await self.client.run_command(command, timeout=timeout)
        if result.exit_code != 0:
            detail = (result.stderr or result.stdout).strip()[-300:]
            raise RuntimeError(f"`{command[:120]}` exited {result.exit_code}: {detail}")
        return result.stdout

    async def launch(self, argv: list[str], window: str | None = None, timeout: float = 20) -> None:
        """Start a program on the sandbox's display, detached from ``run_command``; with ``window``,
        wait (up to ``timeout``) until a visible window of exactly that title is mapped.

        Detached through Popen (new session, no inherited descriptors) rather than ``cmd &``: a
        background job that keeps run_command's output pipes open would make the call wait for it.
        """
        spawn = (
            "import subprocess as s, sys; "
            "s.Popen(sys.argv[1:], stdin=s.DEVNULL, stdout=s.DEVNULL, stderr=s.DEVNULL, start_new_session=True)"
        )
        args = " ".join(shlex.quote(a) for a in argv)
        display = "export DISPLAY=${DISPLAY:-:0}; "
        await self.run_ok(f"{display}{shlex.quote(self.handle.paths.python)} -c {shlex.quote(spawn)} {args}")
        if window is not None:
            await self.run_ok(f"{display}{wait_for_window(window, timeout)}", timeout=timeout + 10)

    async def stop_pidfile(self, pid_file: str, timeout: float = 5) -> None:
        """Stop the process whose pid ``pid_file`` holds (an earlier run's app), wait until it is gone,
        and remove the file. Nothing happens if there is no such file."""
        pid = shlex.quote(pid_file)
        wait_gone = shlex.quote('while kill -0 "$0" 2>/dev/null; do sleep 0.05; done')
        await self.run_ok(
            f'if test -s {pid}; then old="$(cat {pid})"; '
            f'kill "$old" 2>/dev/null && timeout {timeout:g} sh -c {wait_gone} "$old"; fi; rm -f {pid}',
            timeout=timeout + 10,
        )

    async def read_text(self, path: str) -> str:
        return await self.client.read_text(path)

    async def write_text(self, path: str, content: str) -> None:
        await self.client.write_text(path, content)

    async def read_bytes(self, path: str) -> bytes:
        return await self.client.read_bytes(path)

    async def exists(self, path: str) -> bool:
        result = await self.client.run_command(f"test -e {shell_quote(path)}")
        return result.exit_code == 0

    async def screenshot(self) -> bytes:
        return await self.client.screenshot()


def wait_for_window(title: str, timeout: float) -> str:
    """A shell line that waits until a visible window titled exactly ``title`` is mapped.

    ``xdotool search`` walks every window and fails on the first one that vanishes under it (any
    other program closing a window: BadWindow), so the search is retried until it finds this one.
    """
    name = shlex.quote(f"^{re.escape(title)}$")
    until = f'until [ -n "$(xdotool search --onlyvisible --name {name} 2>/dev/null)" ]; do sleep 0.05; done'
    return f"timeout {timeout:g} sh -c {shlex.quote(until)}"


def shell_quote(text: str) -> str:
    """``text`` as one word for a POSIX shell."""
    return "'" + text.replace("'", "'\"'\"'") + "'"
