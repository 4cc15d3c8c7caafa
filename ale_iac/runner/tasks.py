"""Tasks: a folder with a task card, a ``main.py`` grader, input files and a hidden reference.

    my-task/
      task.yaml        id, instruction, snapshot, resources, timeout_s
      main.py          async def setup(sandbox) / async def evaluate(sandbox) -> float in [0, 1]
      input/           staged into the sandbox before the agent starts
      reference/       staged only after the agent has finished (the agent never sees it)

In the sandbox a task's data lives under ``<task_data_root>/<task id>/{input,output,reference}``.

ALE's format (``tasks/<domain>/<task>/`` with ``main.py`` and ``task_card.json``) is loaded by
``runner/ale_tasks.py`` into a subclass of the same :class:`Task`. The lifecycle sees one seam,
:class:`UnitTask`: per unit, ``for_unit()`` (ALE: ``load()`` once), then ``bind`` to the sandbox,
``stage_inputs``, the ``setup`` hook, the agent on ``instruction``, ``stage_reference``, ``evaluate``.

Staging and collecting use the computer-server's file commands only (``create_dir``, ``write_bytes``,
``list_dir``, ``directory_exists``, ``read_bytes``, ``delete_*``), never a shell line, so the same code
serves Windows sandboxes: a remote path with a backslash is joined with backslashes.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ale_iac.config_files import load_model
from ale_iac.contract import Shape
from ale_iac.egress_policy import EgressPolicy
from ale_iac.errors import AleIacError, ConfigError
from ale_iac.sandbox import transport
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.task import TaskSandbox

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
    egress: EgressPolicy | None = Field(
        default=None, description="Narrows its route's egress policy (never widens it): docs/isolation.md, Egress."
    )


Hook = Callable[[TaskSandbox], Awaitable[Any]]


class TaskDataMissingError(AleIacError):
    """A task needs data from the task-data store that is not there: its unit fails before any agent runs."""


class UnitTask(Protocol):
    """A task as one unit runs it (what the lifecycle calls, in this order)."""

    @property
    def id(self) -> str: ...

    @property
    def instruction(self) -> str:
        """The prompt's task text (the runner appends where the input and output folders are)."""
        ...

    def bind(self, handle: SandboxHandle, client: ComputerServerClient) -> TaskSandbox:
        """What the hooks receive: the sandbox and the task's folders in it."""
        ...

    async def stage_inputs(self, sandbox: TaskSandbox) -> int:
        """A clean task folder with the inputs in it, before ``setup``; returns the number of files."""
        ...

    async def stage_reference(self, sandbox: TaskSandbox) -> int:
        """The hidden reference, after the agent has finished; returns the number of files."""
        ...

    def hook(self, name: str) -> Hook | None:
        """``setup`` or ``evaluate``, called with the bound sandbox; None if the task has none."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the unit's record notes about this unit's task (variant, data staged, ...)."""
        ...


@dataclass(frozen=True)
class Task:
    """A loaded task. This format keeps no per-unit state, so it is its own :class:`UnitTask`."""

    card: TaskCard
    folder: Path
    module: ModuleType

    card_file = CARD_NAME
    """The card's file name in ``folder`` (what errors about the card name)."""

    @property
    def id(self) -> str:
        return self.card.id

    @property
    def instruction(self) -> str:
        return self.card.instruction

    @property
    def input_dir(self) -> Path:
        return self.folder / "input"

    @property
    def reference_dir(self) -> Path:
        return self.folder / "reference"

    def for_unit(self) -> UnitTask:
        """The task for one unit (ALE's format calls ``load()`` here, once per unit)."""
        return self

    def bind(self, handle: SandboxHandle, client: ComputerServerClient) -> TaskSandbox:
        return TaskSandbox(handle, client, self.id)

    async def stage_inputs(self, sandbox: TaskSandbox) -> int:
        client = sandbox.client
        await remove_dir(client, sandbox.task_dir)
        await client.make_dir(sandbox.input_dir)
        await client.make_dir(sandbox.output_dir)
        return await stage_dir(sandbox, self.input_dir, sandbox.input_dir) if self.input_dir.is_dir() else 0

    async def stage_reference(self, sandbox: TaskSandbox) -> int:
        if not self.reference_dir.is_dir():
            return 0
        return await stage_dir(sandbox, self.reference_dir, sandbox.reference_dir)

    def hook(self, name: str) -> Hook | None:
        fn = getattr(self.module, name, None)
        return fn if fn is not None else None

    def describe(self) -> dict[str, Any]:
        return {"format": "ale-iac"}


def load_task(folder: Path) -> Task:
    folder = folder.resolve()
    card_path = folder / CARD_NAME
    if not card_path.exists():
        raise ConfigError(folder, CARD_NAME, "task folder has no task card")
    card = load_model(card_path, TaskCard)
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


ALE_CARD_NAME = "task_card.json"


def is_task_folder(folder: Path) -> bool:
    """A folder of either format: a ``task.yaml``, or ALE's ``main.py`` beside a ``task_card.json``."""
    return (folder / CARD_NAME).is_file() or ((folder / ALE_CARD_NAME).is_file() and (folder / "main.py").is_file())


def load_task_list(entry: Path, tasks_root: Path | None = None) -> list[Path]:
    """A list file: one task folder per line, relative to the file or (ALE's ``<domain>/<task>`` lines)
    to ``tasks_root``; '#' starts a comment."""
    folders = []
    for number, raw in enumerate(entry.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        candidates = [entry.parent / line] + ([tasks_root / line] if tasks_root is not None else [])
        folder = next((c.resolve() for c in candidates if is_task_folder(c)), None)
        if folder is None:
            tried = ", ".join(str(c) for c in candidates)
            raise ConfigError(entry, f"line {number}", f"{line!r} is not a task folder (tried {tried})")
        folders.append(folder)
    return folders


MAX_PULL_FILES = 10_000
MAX_PULL_DEPTH = 32
"""Bounds on a pull: file commands follow symbolic links, so a link in the sandbox (``out/root -> /``, a
loop) must not turn a pull into a copy of its whole file system."""


def remote_join(base: str, *parts: str) -> str:
    """``parts`` under the sandbox path ``base``, with its separator (a backslash if it has one)."""
    sep = "\\" if "\\" in base else "/"
    return sep.join([base.rstrip("/\\"), *parts]) if parts else base


async def stage_dir(sandbox: TaskSandbox, local: Path, remote: str) -> int:
    """Copy a host folder into the unit by the fastest transport it offers (``sandbox.transport``)."""
    return await transport.upload_dir(sandbox.handle, sandbox.client, local, remote, upload_dir)


async def collect_dir(sandbox: TaskSandbox, remote: str, local: Path) -> int:
    """Copy a unit's folder (regular files) to the host by the fastest transport it offers."""
    return await transport.download_dir(sandbox.handle, sandbox.client, remote, local, download_dir)


async def upload_dir(client: ComputerServerClient, local: Path, remote: str) -> int:
    """Copy a host folder into the sandbox, byte-exact; returns the number of files."""
    count = 0
    await client.make_dir(remote)
    for path in sorted(local.rglob("*")):
        target = remote_join(remote, *path.relative_to(local).parts)
        if path.is_dir():
            await client.make_dir(target)
        elif path.is_file():
            await client.write_bytes(target, path.read_bytes())
            count += 1
    return count


async def remove_dir(client: ComputerServerClient, remote: str, depth: int = 0) -> None:
    """Remove a sandbox folder and everything in it (nothing if it does not exist)."""
    if not await client.dir_exists(remote):
        if await client.file_exists(remote):
            await client.delete_file(remote)
        return
    if depth > MAX_PULL_DEPTH:
        raise AleIacError(f"{remote} is nested deeper than {MAX_PULL_DEPTH} levels (a link loop?)")
    for name in await client.list_dir(remote):
        path = remote_join(remote, name)
        if await client.dir_exists(path):
            await remove_dir(client, path, depth + 1)
        else:
            await client.delete_file(path)
    await client.delete_dir(remote)


def _checked_name(name: str, remote: str) -> str:
    # The listing comes from the sandbox, which may lie: a name is one path component, never more.
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise AleIacError(f"refusing to pull {name!r} from {remote}: it points outside the output folder")
    return name


async def download_dir(client: ComputerServerClient, remote: str, local: Path) -> int:
    """Copy a sandbox folder to the host (regular files only); returns the number of files.

    At most :data:`MAX_PULL_FILES` files, :data:`MAX_PULL_DEPTH` levels deep; the rest is left behind."""
    if not await client.dir_exists(remote):
        return 0
    root = local.resolve()
    count = 0

    async def pull(folder: str, parts: tuple[str, ...]) -> None:
        nonlocal count
        for raw in sorted(await client.list_dir(folder)):
            name = _checked_name(raw, remote)
            path = remote_join(folder, name)
            if count >= MAX_PULL_FILES:
                return
            if await client.dir_exists(path):
                if len(parts) < MAX_PULL_DEPTH:
                    await pull(path, (*parts, name))
                continue
            dest = root.joinpath(*parts, name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if not dest.parent.resolve().is_relative_to(root):
                raise AleIacError(f"refusing to pull {name!r} from {remote}: it points outside the output folder")
            if dest.is_symlink():
                dest.unlink()  # replaced, never written through
            dest.write_bytes(await client.read_bytes(path))
            count += 1

    local.mkdir(parents=True, exist_ok=True)
    await pull(remote, ())
    return count
