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
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ale_iac.contract import Shape
from ale_iac.errors import AleIacError, ConfigError, load_model
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.task import TaskSandbox, shell_quote

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


async def upload_dir(client: ComputerServerClient, local: Path, remote: str) -> int:
    """Copy a host folder into the sandbox, byte-exact; returns the number of files."""
    count = 0
    await client.run_command(f"mkdir -p {shell_quote(remote)}")
    for path in sorted(local.rglob("*")):
        target = f"{remote}/{path.relative_to(local).as_posix()}"
        if path.is_dir():
            await client.run_command(f"mkdir -p {shell_quote(target)}")
        elif path.is_file():
            await client.write_bytes(target, path.read_bytes())
            count += 1
    return count


async def download_dir(client: ComputerServerClient, remote: str, local: Path) -> int:
    """Copy a sandbox folder to the host (regular files only); returns the number of files."""
    listing = await client.run_command(f"cd {shell_quote(remote)} 2>/dev/null && find . -type f -print0 | base64 -w0")
    if listing.exit_code != 0 or not listing.stdout.strip():
        return 0
    names = [n for n in base64.b64decode(listing.stdout.strip()).decode(errors="replace").split("\0") if n]
    local.mkdir(parents=True, exist_ok=True)
    root = local.resolve()
    for name in names:
        rel = name[2:] if name.startswith("./") else name
        parts = Path(rel).parts
        # The listing comes from the sandbox, which may lie: never write outside ``local``.
        if not parts or rel.startswith("/") or ".." in parts or parts == (".",):
            raise AleIacError(f"refusing to pull {name!r} from {remote}: it points outside the output folder")
        dest = root.joinpath(*parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.parent.resolve().is_relative_to(root):
            raise AleIacError(f"refusing to pull {name!r} from {remote}: it points outside the output folder")
        if dest.is_symlink():
            dest.unlink()  # replaced, never written through
        dest.write_bytes(await client.read_bytes(f"{remote}/{rel}"))
    return len(names)
