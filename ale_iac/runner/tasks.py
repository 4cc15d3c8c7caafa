"""Tasks: a folder with a task card, a ``main.py`` grader, input files and a hidden reference.

    my-task/
      task.yaml        id, instruction, snapshot, resources, timeout_s
      main.py          async def setup(sandbox) / async def evaluate(sandbox) -> float in [0, 1]
      input/           staged into the sandbox before the agent starts
      reference/       staged only after the agent has finished (the agent never sees it)

In the sandbox a task's data lives under ``<task_data_root>/<task id>/{input,output,reference}``.
"""

from __future__ import annotations

import base64
import importlib.util
import inspect
import re
import shlex
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ale_iac.errors import ConfigError, format_validation_error, yaml_error
from ale_iac.profile import Shape
from ale_iac.sandbox.client import CommandResult, ComputerServerClient
from ale_iac.sandbox.handle import SandboxHandle

CARD_NAME = "task.yaml"
_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


class TaskCard(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Unique task id: lowercase letters, digits, '.', '_', '-'.")
    instruction: str = Field(min_length=1, description="The prompt the agent receives.")
    snapshot: str | None = Field(default=None, description="Logical snapshot; default: the profile's.")
    resources: Shape = Field(default_factory=Shape, description="Resource hints for the sandbox.")
    timeout_s: float | None = Field(default=None, gt=0, description="Agent time limit for this task.")
    tags: list[str] = Field(default_factory=list)


@dataclass(frozen=True)
class Task:
    card: TaskCard
    folder: Path
    module: ModuleType

    @property
    def id(self) -> str:
        return self.card.id

    @property
    def input_dir(self) -> Path:
        return self.folder / "input"

    @property
    def reference_dir(self) -> Path:
        return self.folder / "reference"

    def hook(self, name: str) -> Callable[[TaskSandbox], Awaitable[Any]] | None:
        fn = getattr(self.module, name, None)
        return fn if fn is not None else None


def load_task(folder: Path) -> Task:
    folder = folder.resolve()
    card_path = folder / CARD_NAME
    if not card_path.exists():
        raise ConfigError(folder, CARD_NAME, "task folder has no task card")
    try:
        data = yaml.safe_load(card_path.read_text())
    except yaml.YAMLError as exc:
        raise yaml_error(card_path, exc) from None
    try:
        card = TaskCard.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(card_path, exc) from None
    if not _ID_RE.match(card.id):
        raise ConfigError(card_path, "id", f"{card.id!r} must be lowercase letters, digits, '.', '_' or '-'")
    main = folder / "main.py"
    if not main.exists():
        raise ConfigError(folder, "main.py", "task folder has no main.py (needs async def evaluate(sandbox))")
    module_name = f"ale_tasks.{card.id.replace('-', '_').replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(module_name, main)
    if spec is None or spec.loader is None:
        raise ConfigError(main, "", "cannot import")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(main, "", f"import failed: {type(exc).__name__}: {exc}") from None
    for name, required in (("setup", False), ("evaluate", True)):
        fn = getattr(module, name, None)
        if fn is None:
            if required:
                raise ConfigError(main, name, "missing: define async def evaluate(sandbox) -> float")
            continue
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(main, name, "must be an async function (async def)")
    return Task(card=card, folder=folder, module=module)


def load_task_list(entry: Path) -> list[Path]:
    """A list file: one task folder per line, relative to the file; '#' starts a comment."""
    folders = []
    for number, raw in enumerate(entry.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        folder = (entry.parent / line).resolve()
        if not (folder / CARD_NAME).exists():
            raise ConfigError(entry, f"line {number}", f"{line!r} is not a task folder")
        folders.append(folder)
    return folders


class TaskSandbox:
    """What ``setup`` and ``evaluate`` receive: the sandbox plus the task's paths inside it."""

    def __init__(self, handle: SandboxHandle, client: ComputerServerClient, task_id: str) -> None:
        self.handle = handle
        self.client = client
        self.task_dir = f"{handle.paths.task_data_root.rstrip('/')}/{task_id}"
        self.input_dir = f"{self.task_dir}/input"
        self.output_dir = f"{self.task_dir}/output"
        self.reference_dir = f"{self.task_dir}/reference"

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
            title = shlex.quote(f"^{re.escape(window)}$")
            await self.run_ok(
                f"{display}timeout {timeout:g} xdotool search --sync --onlyvisible --name {title} >/dev/null",
                timeout=timeout + 10,
            )

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
        result = await self.client.run_command(f"test -e {_quote(path)}")
        return result.exit_code == 0

    async def screenshot(self) -> bytes:
        return await self.client.screenshot()


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


async def upload_dir(client: ComputerServerClient, local: Path, remote: str) -> int:
    """Copy a host folder into the sandbox, byte-exact; returns the number of files."""
    count = 0
    await client.run_command(f"mkdir -p {_quote(remote)}")
    for path in sorted(local.rglob("*")):
        target = f"{remote}/{path.relative_to(local).as_posix()}"
        if path.is_dir():
            await client.run_command(f"mkdir -p {_quote(target)}")
        elif path.is_file():
            await client.write_bytes(target, path.read_bytes())
            count += 1
    return count


async def download_dir(client: ComputerServerClient, remote: str, local: Path) -> int:
    """Copy a sandbox folder to the host (regular files only); returns the number of files."""
    listing = await client.run_command(f"cd {_quote(remote)} 2>/dev/null && find . -type f -print0 | base64 -w0")
    if listing.exit_code != 0 or not listing.stdout.strip():
        return 0
    names = [n for n in base64.b64decode(listing.stdout.strip()).decode().split("\0") if n]
    for name in names:
        rel = name[2:] if name.startswith("./") else name
        dest = local / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(await client.read_bytes(f"{remote}/{rel}"))
    return len(names)
