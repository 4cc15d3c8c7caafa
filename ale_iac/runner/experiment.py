"""Experiment specs: which agents on which tasks, how often, where, and how to clean up.

    name: demo
    agents: [scripted]                 # preset names (agents/<name>/preset.yaml) or preset files
    tasks: [tasks/cli-wordcount, tasks.txt]   # task folders (either format) or list files
    tasks_root: ale/tasks              # ALE's tasks/ folder (or the one above it): <domain>/<task> entries
    task_data: ale-data                # ALE's task-data store: <domain>/<task>[/<variant>]/{input,software,reference}
    repeats: 1
    profile: local                     # or pool: <stack> to lease units of a pool stack
    concurrency: 2
    shared_stack: false                # true: one stack of `concurrency` sandboxes for the run, fresh for each unit
    cleanup: destroy                   # destroy | retain | retain-on-failure
    retain_below: 0.5                  # also retain units that scored below this (optional)
    unit_timeout_s: 600
    output_root: runs
    model_plan: plan.yaml              # follow this scripted plan instead of the agents' models (no API key)

Paths are relative to the experiment file. Flags of ``ale-iac evaluate`` override the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ale_iac.agent_sdk import AgentConfig
from ale_iac.config_files import read_yaml, validate
from ale_iac.errors import ConfigError, Problems
from ale_iac.llm.plan import load_plan
from ale_iac.paths import project_root
from ale_iac.profile import CleanupMode
from ale_iac.runner.ale_tasks import LocalTaskData, load_ale_task
from ale_iac.runner.tasks import CARD_NAME, Task, is_task_folder, load_task, load_task_list


class ExperimentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$", description="Experiment name.")
    agents: list[str] = Field(min_length=1, description="Agent presets: names or preset yaml paths.")
    tasks: list[str] = Field(min_length=1, description="Task folders (either format) or list files.")
    tasks_root: str | None = Field(
        default=None, description="ALE's tasks/ folder (or the folder above it): where <domain>/<task> entries are."
    )
    task_data: str | None = Field(
        default=None, description="ALE's task-data store, a folder of <domain>/<task>/{input,software,reference}."
    )
    repeats: int = Field(default=1, ge=1, le=1000)
    profile: str | None = Field(default=None, description="Environment profile (default: local).")
    pool: str | None = Field(default=None, description="Lease units from this pool stack instead.")
    concurrency: int = Field(default=1, ge=1, le=256)
    shared_stack: bool = Field(
        default=False,
        description="One stack for the run instead of one per unit: a sandbox per concurrency slot, brought up "
        "once, made fresh between units (reset: restore by its substrate; reset: recreate by a targeted update "
        "that units ending together share, or removed once no unit needs it), destroyed when the run ends.",
    )
    cleanup: CleanupMode | None = Field(default=None, description="Default: the profile's mode.")
    retain_below: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Also retain the sandbox of a unit that scored below this (or got no score).",
    )
    unit_timeout_s: float = Field(default=900, gt=0, description="Agent time limit per unit.")
    output_root: str = Field(default="runs")
    model_plan: str | None = Field(
        default=None,
        description="A scripted model plan (docs/models.md): the run's scripted model server answers every "
        "agent's model calls instead of its vendor; no API key needed.",
    )

    @model_validator(mode="after")
    def _one_target(self) -> ExperimentSpec:
        if self.profile and self.pool:
            raise ValueError("give either profile or pool, not both")
        if self.shared_stack and self.pool:
            raise ValueError("shared_stack is for a profile's units: a pool's units are shared already")
        return self


@dataclass(frozen=True)
class UnitPlan:
    """One unit: one agent x one task x one repeat."""

    unit_id: str
    agent: AgentConfig
    task: Task
    repeat: int


@dataclass(frozen=True)
class Experiment:
    spec: ExperimentSpec
    source: Path
    agents: list[AgentConfig]
    tasks: list[Task]
    preset_files: dict[str, Path] = field(default_factory=dict)
    """Agent name -> the preset file it was read from."""
    model_plan: Path | None = None
    """The scripted model plan the run follows instead of the agents' models (checked when loaded)."""

    def preset_file(self, agent: AgentConfig) -> Path | str:
        """Where ``agent``'s preset came from, for errors that name the file."""
        if agent.name in self.preset_files:
            return self.preset_files[agent.name]
        return Path(agent.source_dir) / "preset.yaml" if agent.source_dir else f"agent {agent.name}"

    @property
    def units(self) -> list[UnitPlan]:
        return [
            UnitPlan(unit_id=f"{agent.name}__{task.id}__r{r}", agent=agent, task=task, repeat=r)
            for agent in self.agents
            for task in self.tasks
            for r in range(self.spec.repeats)
        ]

    @property
    def output_root(self) -> Path:
        return (self.source.parent / self.spec.output_root).resolve()

    def fingerprint(self) -> str:
        """What --resume compares, so that one run never mixes two graders or two agents: the spec
        (minus output, concurrency and shared_stack), each agent preset and its deployer file, and each task's
        whole folder (card, ``main.py`` hooks, inputs, hidden reference), by content."""
        data = {
            "spec": self.spec.model_dump(mode="json", exclude={"output_root", "concurrency", "shared_stack"}),
            "agents": [
                {**a.model_dump(mode="json", exclude={"source_dir"}), "deployer_file": _deployer_digest(a)}
                for a in self.agents
            ],
            "tasks": [{"card": t.card.model_dump(mode="json"), "files": folder_digest(t.folder)} for t in self.tasks],
        }
        if self.model_plan is not None:  # only then: runs without a plan keep their fingerprints
            data["model_plan"] = hashlib.sha256(self.model_plan.read_bytes()).hexdigest()
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def folder_digest(folder: Path) -> str:
    """A hash of every file under ``folder`` (relative path and bytes), bytecode caches excepted."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _deployer_digest(agent: AgentConfig) -> str | None:
    """The hash of a preset's ``file.py:Class`` deployer (a ``module:Class`` one is code of an installed package)."""
    target = agent.deployer.rsplit(":", 1)[0]
    path = Path(agent.source_dir) / target
    if not target.endswith(".py") or not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find_agent_preset(ref: str, base: Path, source: Path) -> Path:
    """A preset's file, by path (relative to ``base``) or by name (``agents/<name>/preset.yaml``)."""
    candidates = [base / ref]
    if not ref.endswith((".yaml", ".yml")):
        candidates += [base / "agents" / ref / "preset.yaml", project_root() / "agents" / ref / "preset.yaml"]
    path = next((c.resolve() for c in candidates if c.is_file()), None)
    if path is None:
        raise ConfigError(source, "agents", f"no agent preset {ref!r} (tried {', '.join(str(c) for c in candidates)})")
    return path


def load_agent_preset(ref: str, base: Path, source: Path) -> AgentConfig:
    """A preset by file path (relative to ``base``) or by name (``agents/<name>/preset.yaml``)."""
    path = find_agent_preset(ref, base, source)
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(path, "", "an agent preset must be a mapping")
    return validate(AgentConfig, {**data, "source_dir": str(path.parent)}, path)


def _tasks_root(spec: ExperimentSpec, base: Path, source: Path) -> Path | None:
    if spec.tasks_root is None:
        return None
    root = (base / spec.tasks_root).resolve()
    if (root / "tasks").is_dir():
        root = root / "tasks"
    if not root.is_dir():
        raise ConfigError(source, "tasks_root", f"{spec.tasks_root!r} is not a folder")
    return root


def _task_folders(ref: str, base: Path, source: Path, tasks_root: Path | None) -> list[Path]:
    candidates = [(base / ref).resolve()] + ([(tasks_root / ref).resolve()] if tasks_root is not None else [])
    for path in candidates:
        if path.is_dir():
            if not is_task_folder(path):
                raise ConfigError(
                    source, "tasks", f"{ref!r} is a folder without a {CARD_NAME} or main.py + task_card.json"
                )
            return [path]
        if path.is_file():
            return load_task_list(path, tasks_root)
    raise ConfigError(source, "tasks", f"{ref!r} is neither a task folder nor a list file")


def _task_data(spec: ExperimentSpec, base: Path, source: Path) -> LocalTaskData | None:
    if spec.task_data is None:
        return None
    store_dir = (base / spec.task_data).resolve()
    if not store_dir.is_dir():
        raise ConfigError(source, "task_data", f"{spec.task_data!r} is not a folder")
    return LocalTaskData(store_dir)


def _load_tasks(spec: ExperimentSpec, base: Path, source: Path, problems: Problems) -> list[Task]:
    """Every task the spec names; a task (or list file) that does not load is one more of ``problems``."""
    tasks_root = _tasks_root(spec, base, source)
    store = _task_data(spec, base, source)
    tasks: list[Task] = []
    for ref in spec.tasks:
        folders: list[Path] = []
        with problems.check():
            folders = _task_folders(ref, base, source, tasks_root)
        for folder in folders:
            with problems.check():
                tasks.append(load_any_task(folder, store))
    return tasks


def load_any_task(folder: Path, data_store: LocalTaskData | None = None) -> Task:
    """A task folder of either format: ``task.yaml`` (this project's) or ALE's ``main.py`` + ``task_card.json``."""
    return load_task(folder) if (folder / CARD_NAME).is_file() else load_ale_task(folder, data_store)


def load_experiment(path: Path, overrides: dict[str, Any] | None = None) -> Experiment:
    """Read, override, validate. Every error names the file and the field; all of them are reported at once
    (the spec's, then those of every preset and task it names)."""
    path = path.resolve()
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(path, "", "an experiment must be a mapping")
    merged = {**data, **{k: v for k, v in (overrides or {}).items() if v is not None}}
    if overrides and overrides.get("pool"):
        merged.pop("profile", None)
    if overrides and overrides.get("profile"):
        merged.pop("pool", None)
    spec = validate(ExperimentSpec, merged, path)
    base = path.parent
    problems = Problems()
    agents = []
    for ref in spec.agents:
        with problems.check():
            agents.append(load_agent_preset(ref, base, path))
    names = [a.name for a in agents]
    if len(set(names)) != len(names):
        problems.add(path, "agents", f"two presets share a name: {names}")
    tasks: list[Task] = []
    with problems.check():
        tasks = _load_tasks(spec, base, path, problems)
    problems.raise_any()
    ids = [t.id for t in tasks]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ConfigError(path, "tasks", f"task ids listed twice: {', '.join(duplicates)}")
    return Experiment(
        spec=spec,
        source=path,
        agents=agents,
        tasks=tasks,
        preset_files={a.name: find_agent_preset(ref, base, path) for ref, a in zip(spec.agents, agents, strict=True)},
        model_plan=_model_plan(spec, base, path, agents),
    )


def _model_plan(spec: ExperimentSpec, base: Path, source: Path, agents: list[AgentConfig]) -> Path | None:
    """The plan file, read and checked now (its errors name it and the field), before anything is made."""
    if spec.model_plan is None:
        return None
    plan = (base / spec.model_plan).resolve()
    if not plan.is_file():
        raise ConfigError(source, "model_plan", f"{spec.model_plan!r} is not a file")
    load_plan(plan)
    if not any(agent.model for agent in agents):
        raise ConfigError(source, "model_plan", "no agent of this experiment uses a model, so none would follow it")
    return plan
