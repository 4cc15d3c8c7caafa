"""ALE's task format (cua-bench tasks), run unchanged.

    <root>/tasks/<domain>/<task>/
      main.py           @cb.tasks_config load() -> [cb.Task], @cb.setup_task start(cfg, session),
                        @cb.evaluate_task evaluate(cfg, session) -> [score] | score | {"score": ...}
      task_card.json    taskPrompt, vm{snapshot, machineType, vcpus, memory_gb, disk_gb, timeout_s|timeout}, ...
      scripts/          task-local helper modules (score_outputs.py, ...), importable while main.py loads

``main.py`` is imported as ALE does: the folder above ``tasks/`` on ``sys.path`` (tasks import
``tasks.<shared module>``), the task's folder and its ``scripts/`` too, and ``cua_bench`` importable (the
stand-in of :mod:`ale_iac.compat` unless the real package is). Afterwards every module the load brought
in from the tasks tree or under a task-local name is evicted, so the next task's ``score_outputs`` is its own.

Per unit (:meth:`AleTask.for_unit`) ``load()`` runs once; its first variant is the unit's, and the same
object goes to ``start`` and ``evaluate``; its ``description`` is the prompt. A task that requires task data
(metadata ``requires_task_data``, default true) gets ``input/`` and ``software/`` from the experiment's
task-data store before setup and ``reference/`` only after the agent has finished; a task whose data is
missing fails its unit (``task_data_missing``) before any sandbox is asked for.

In the sandbox the task's folders are the ones its metadata names (``task_dir``, ``input_dir``,
``software_dir``, ``remote_output_dir``, ``reference_dir``), else ``<ale_root>/<domain>/<task>[/<variant>]/...``
with the sandbox's ALE root (:attr:`~ale_iac.contract.SandboxPaths.ale_root`) and separator.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ale_iac.compat import cua_bench_importable
from ale_iac.compat.cua_bench import ROLE_ATTR, DesktopSession
from ale_iac.config_files import validate
from ale_iac.contract import ALE_LINUX_ROOT, ALE_WINDOWS_ROOT, Shape
from ale_iac.errors import AleIacError, ConfigError
from ale_iac.runner.tasks import (
    ALE_CARD_NAME,
    Hook,
    Task,
    TaskCard,
    TaskDataMissingError,
    UnitTask,
    remote_join,
    remove_dir,
    stage_dir,
)
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.task import Evaluation, TaskSandbox

MAIN = "main.py"
SCRIPTS = "scripts"
ROLES = ("tasks_config", "setup_task", "evaluate_task")
FALLBACK_NAMES = {"tasks_config": ("load",), "setup_task": ("start", "setup"), "evaluate_task": ("evaluate",)}
"""Where the real cua_bench loaded a task (its decorators leave no mark of ours): the names ALE's tasks use."""
_ID_CHARS = re.compile(r"[^a-z0-9._-]+")


class AleVm(BaseModel):
    """The card's ``vm`` block: what the runner reads of it (the rest is kept, not checked)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    snapshot: str | None = None
    machineType: str | None = None  # noqa: N815 (the card's own spelling)
    vcpus: int | None = Field(default=None, ge=1, le=1024)
    memory_gb: float | None = Field(default=None, gt=0, le=16384)
    disk_gb: int | None = Field(default=None, ge=1, le=65536)
    timeout_s: float | None = Field(default=None, gt=0)
    timeout: float | None = Field(default=None, gt=0)


class AleCard(BaseModel):
    """``task_card.json``: the fields the runner reads; unknown fields are kept."""

    model_config = ConfigDict(extra="allow", frozen=True)

    title: str | None = None
    summary: str | None = None
    taskPrompt: str | None = None  # noqa: N815
    vm: AleVm = Field(default_factory=AleVm)
    tags: list[str] = Field(default_factory=list)


def read_card(path: Path) -> AleCard:
    """The card, or one ConfigError naming the file and the field."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(path, "", "file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(path, "", f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(path, "", f"a task card must be a JSON object, not {type(data).__name__}")
    return validate(AleCard, data, path)


class LocalTaskData:
    """The task-data store: a local folder ``<store>/<domain>/<task>[/<variant>]/{input,software,reference}``
    (the variant level is optional). A bucket store would fetch into a cache and answer the same."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def candidates(self, domain: str, task: str, variant: str | None) -> list[Path]:
        base = self.root / domain / task
        return [base / variant, base] if variant else [base]

    def find(self, domain: str, task: str, variant: str | None) -> Path | None:
        """The task's data folder (one with an ``input/``), or None."""
        return next((c for c in self.candidates(domain, task, variant) if (c / "input").is_dir()), None)


@dataclass(frozen=True)
class AleTask(Task):
    """An ALE task: the card read into the runner's :class:`TaskCard`, the three decorated functions."""

    card_file = ALE_CARD_NAME
    domain: str = ""
    name: str = ""
    load_fn: Callable[[], Any] | None = None
    setup_fn: Callable[..., Any] | None = None
    evaluate_fn: Callable[..., Any] | None = None
    data_store: LocalTaskData | None = None

    def for_unit(self) -> UnitTask:
        """``load()`` once; its first variant; the unit's task data found (or TaskDataMissingError)."""
        assert self.load_fn is not None
        variants = self.load_fn()
        if not isinstance(variants, list | tuple) or not variants:
            raise AleIacError(f"load() of task {self.domain}/{self.name} returned {variants!r}, not a list of Tasks")
        cfg = variants[0]
        metadata = getattr(cfg, "metadata", None)
        metadata = dict(metadata) if isinstance(metadata, dict) else {}
        variant = _str(metadata.get("variant_name"))
        data_dir: Path | None = None
        if bool(metadata.get("requires_task_data", True)):
            if self.data_store is None:
                raise TaskDataMissingError(
                    f"task {self.domain}/{self.name} requires task data, and the experiment names no task_data store"
                )
            data_dir = self.data_store.find(self.domain, self.name, variant)
            if data_dir is None:
                tried = " or ".join(
                    str(c / "input") for c in self.data_store.candidates(self.domain, self.name, variant)
                )
                raise TaskDataMissingError(f"task {self.domain}/{self.name} requires task data: no {tried}")
        return AleUnit(self, cfg, metadata, variant, data_dir)


class AleSandbox(TaskSandbox):
    """What the runner keeps for an ALE unit: the task's folders (``software_dir`` too) and the session."""

    software_dir: str
    session: DesktopSession


class AleUnit:
    """One unit of an ALE task: the variant ``load()`` gave, handed to both hooks."""

    def __init__(self, task: AleTask, cfg: Any, metadata: dict[str, Any], variant: str | None, data: Path | None):
        self.task, self.cfg, self.metadata, self.variant, self.data = task, cfg, metadata, variant, data

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def instruction(self) -> str:
        description = getattr(self.cfg, "description", None)
        return description if isinstance(description, str) and description.strip() else self.task.card.instruction

    def bind(self, handle: SandboxHandle, client: ComputerServerClient) -> TaskSandbox:
        root = handle.paths.ale_root or (ALE_WINDOWS_ROOT if handle.os == "windows" else ALE_LINUX_ROOT)
        parts = [
            _str(self.metadata.get("domain_name")) or self.task.domain,
            _str(self.metadata.get("task_name")) or self.task.name,
        ]
        task_dir = _str(self.metadata.get("task_dir")) or remote_join(root, *parts, *filter(None, [self.variant]))
        sandbox = AleSandbox(handle, client, self.id, task_dir=task_dir)
        named = {"input_dir": "input_dir", "output_dir": "remote_output_dir", "reference_dir": "reference_dir"}
        for attr, key in named.items():
            if value := _str(self.metadata.get(key)):
                setattr(sandbox, attr, value)
        sandbox.software_dir = _str(self.metadata.get("software_dir")) or remote_join(task_dir, "software")
        sandbox.session = DesktopSession(client, os_type=handle.os)
        return sandbox

    async def stage_inputs(self, sandbox: TaskSandbox) -> int:
        """No reference and an empty output folder, whatever an earlier unit left; with task data, fresh
        ``input/`` and ``software/`` from the store."""
        assert isinstance(sandbox, AleSandbox)
        client = sandbox.client
        for folder in (sandbox.reference_dir, sandbox.output_dir):
            await remove_dir(client, folder)
        await client.make_dir(sandbox.output_dir)
        if self.data is None:
            return 0
        staged = 0
        for name, remote in (("input", sandbox.input_dir), ("software", sandbox.software_dir)):
            await remove_dir(client, remote)
            if (self.data / name).is_dir():
                staged += await stage_dir(sandbox, self.data / name, remote)
        return staged

    async def stage_reference(self, sandbox: TaskSandbox) -> int:
        if self.data is None or not (self.data / "reference").is_dir():
            return 0
        await remove_dir(sandbox.client, sandbox.reference_dir)
        return await stage_dir(sandbox, self.data / "reference", sandbox.reference_dir)

    def hook(self, name: str) -> Hook | None:
        fn = {"setup": self.task.setup_fn, "evaluate": self.task.evaluate_fn}.get(name)
        if fn is None:
            return None
        call: Callable[..., Any] = fn

        async def run(sandbox: TaskSandbox) -> Any:
            assert isinstance(sandbox, AleSandbox)
            value = call(self.cfg, sandbox.session)
            if inspect.isawaitable(value):
                value = await value
            return as_score(value) if name == "evaluate" else value

        return run

    def describe(self) -> dict[str, Any]:
        return {
            "format": "ale",
            "domain": self.task.domain,
            "task": self.task.name,
            "variant": self.variant,
            "requires_task_data": self.data is not None,
            "task_data": str(self.data) if self.data is not None else None,
        }


def as_score(value: Any) -> Any:
    """What ALE's tasks return, as the runner takes it: ``[score, ...]`` (the rest kept as ``raw_scores``),
    a number, or a dict with ``score`` (or ``final_score``). Anything else is returned as is and fails the
    runner's check."""
    if isinstance(value, list | tuple) and value and _number(value[0]):
        return Evaluation(float(value[0]), {"raw_scores": [_jsonable(v) for v in value]})
    if isinstance(value, dict):
        key = next((k for k in ("score", "final_score") if _number(value.get(k))), None)
        if key is not None:
            return Evaluation(float(value[key]), {k: _jsonable(v) for k, v in value.items() if k != key})
    return value


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def ale_task_id(domain: str, name: str) -> str:
    """``<domain>.<task>`` as a task id (lowercase; other characters become '-'), at most 64 characters."""
    slug = _ID_CHARS.sub("-", f"{domain}.{name}".lower()).strip("-._") or "task"
    return slug[:64]


@contextmanager
def _task_imports(folder: Path, tasks_dir: Path) -> Iterator[None]:
    """``sys.path`` and ``sys.modules`` as ALE's loader sets them while one task's ``main.py`` loads,
    restored afterwards: what the load brought in from the tasks tree or under a task-local name goes."""
    scripts = folder / SCRIPTS
    local = {"tasks", SCRIPTS}
    if scripts.is_dir():
        local |= {p.stem for p in scripts.glob("*.py")} | {p.name for p in scripts.iterdir() if p.is_dir()}
    # Another task's helpers (or anything) under the same names must not answer this task's imports.
    shadowed = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in local}
    before = set(sys.modules)
    saved_path = list(sys.path)
    sys.path[:0] = [str(p) for p in (scripts, folder, tasks_dir.parent) if p.is_dir()]
    importlib.invalidate_caches()
    try:
        with cua_bench_importable():
            yield
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None)
            inside = origin is not None and Path(origin).resolve().is_relative_to(tasks_dir)
            if name.split(".")[0] in local or inside:
                del sys.modules[name]
        for name, module in shadowed.items():
            sys.modules.setdefault(name, module)


def _import_main(main: Path, module_name: str, tasks_dir: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, main)
    if spec is None or spec.loader is None:
        raise ConfigError(main, "", "cannot import")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses in main.py look their module up while it loads
    try:
        with _task_imports(main.parent, tasks_dir):
            spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ConfigError(main, "", f"import failed: {type(exc).__name__}: {exc}") from None
    return module


def _functions(module: ModuleType, main: Path) -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for value in vars(module).values():
        if inspect.isfunction(value) and getattr(value, ROLE_ATTR, None) in ROLES:
            found.setdefault(getattr(value, ROLE_ATTR), value)
    for role, names in FALLBACK_NAMES.items():
        if role not in found:
            fn = next((getattr(module, n) for n in names if inspect.isfunction(getattr(module, n, None))), None)
            if fn is not None:
                found[role] = fn
    for role in ("tasks_config", "evaluate_task"):
        if role not in found:
            raise ConfigError(main, role, f"no function decorated with @cb.{role} (ALE's task format needs one)")
    return found


def load_ale_task(folder: Path, data_store: LocalTaskData | None = None) -> AleTask:
    """An ALE task folder ``<root>/tasks/<domain>/<task>/``; errors name the file and the field."""
    folder = folder.resolve()
    card_path = folder / ALE_CARD_NAME
    main = folder / MAIN
    if not main.is_file():
        raise ConfigError(folder, MAIN, "an ALE task folder needs a main.py")
    card = read_card(card_path)
    domain, name, tasks_dir = folder.parent.name, folder.name, folder.parent.parent
    task_id = ale_task_id(domain, name)
    module = _import_main(main, f"ale_iac_ale_task__{task_id.replace('.', '__').replace('-', '_')}", tasks_dir)
    functions = _functions(module, main)
    vm = card.vm
    instruction = card.taskPrompt or card.summary or card.title or f"ALE task {domain}/{name}"
    runner_card = TaskCard(
        id=task_id,
        instruction=instruction,
        snapshot=vm.snapshot,
        resources=Shape(vcpus=vm.vcpus, memory_gb=vm.memory_gb, disk_gb=vm.disk_gb, machine_type=vm.machineType),
        timeout_s=vm.timeout_s or vm.timeout,
        tags=card.tags,
    )
    return AleTask(
        card=runner_card,
        folder=folder,
        module=module,
        domain=domain,
        name=name,
        load_fn=functions["tasks_config"],
        setup_fn=functions.get("setup_task"),
        evaluate_fn=functions["evaluate_task"],
        data_store=data_store,
    )
