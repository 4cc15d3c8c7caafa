"""``ale-iac evaluate``: run every unit of an experiment with bounded concurrency, record, summarize.

Interrupts: the first SIGINT/SIGTERM cancels every unit; each unit's cleanup runs (destroying its
stack) before the process exits. A second one stops waiting, prints what is left and the command
that removes it, and exits at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ale_iac.agent_sdk import CliInstall, load_deployer_class
from ale_iac.agent_sdk.config import AgentConfig, ToolCatalog
from ale_iac.agent_sdk.executor_registry import executor_class
from ale_iac.bridges.warm import WARM_ENV, WarmBridges
from ale_iac.egress_policy import EgressPolicy
from ale_iac.engine import Engine
from ale_iac.errors import AleIacError, ConfigError, Problems, one_line
from ale_iac.llm.gateway import ModelGateway
from ale_iac.profile import CleanupMode, LoadedProfile, Profile, resolve_profile
from ale_iac.provision import destroy_stack, ensure_images
from ale_iac.runner.egress import leased_policy, policy_for
from ale_iac.runner.experiment import Experiment, ExperimentSpec, UnitPlan
from ale_iac.runner.lifecycle import RunContext, UnitOutcome, run_unit
from ale_iac.runner.model_plan import LOG_NAME as PLAN_LOG
from ale_iac.runner.model_plan import PlanServer, plan_record
from ale_iac.runner.progress import Progress
from ale_iac.runner.provisioners import RETAINED, Pool, PoolProvisioner, Provisioner, StackProvisioner, static_pool
from ale_iac.runner.records import MANIFEST, Redactor
from ale_iac.runner.run_claims import RunRegistry, read_claims
from ale_iac.runner.shared_stack import SharedStack, check_shared_stack
from ale_iac.runner.status import UnitStatus
from ale_iac.runner.tasks import CARD_NAME, Task
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.handle import SandboxHandle

RESULTS = "results.jsonl"
PREPARED_AHEAD = 4
"""At most this many units waiting for a slot have their stack made ahead (and at most the concurrency)."""


@dataclass
class RunSummary:
    run_id: str
    run_dir: Path
    outcomes: list[UnitOutcome]
    skipped: list[str] = field(default_factory=list)
    interrupted: bool = False
    not_started: list[str] = field(default_factory=list)
    """Units an interrupt stopped before they started (``--resume`` runs them)."""

    @property
    def retained(self) -> list[UnitOutcome]:
        return [o for o in self.outcomes if o.cleanup == RETAINED]


def _new_run_dir(experiment: Experiment) -> tuple[str, Path]:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    run_id = f"{experiment.spec.name}-{stamp}-{os.getpid() % 100000:05d}"
    return run_id, experiment.output_root / run_id


def latest_run_dir(experiment: Experiment) -> Path | None:
    """The newest run of this experiment under its output root, by the name its own manifest records
    (a folder name's prefix would also match ``<name>-other``'s runs)."""
    candidates = []
    for manifest in experiment.output_root.glob(f"*/{MANIFEST}"):
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and (data.get("spec") or {}).get("name") == experiment.spec.name:
            candidates.append(manifest.parent)
    candidates.sort(key=lambda p: (p / MANIFEST).stat().st_mtime)
    return candidates[-1] if candidates else None


def recover_crashed_attempt(run_id: str, destroy: Callable[[str], bool], say: Callable[[str], None]) -> list[str]:
    """Before ``--resume`` reuses ``run_id``: destroy the stacks its earlier, dead attempt had claimed
    (the registry knows them), and say so. Stacks it retained on purpose stay retained. Returns the
    stacks destroyed. Refuses if that attempt is still running."""
    earlier = next((c for c in read_claims() if c.run_id == run_id), None)
    if earlier is None:
        return []
    if earlier.alive:
        raise AleIacError(f"run {run_id} is still running (pid {earlier.pid}); wait for it or stop it first")
    destroyed = []
    for stack in earlier.stacks:
        if destroy(stack):
            destroyed.append(stack)
            say(f"destroyed stack {stack}, left by the crashed earlier attempt of this run")
    return destroyed


def _finished_units(run_dir: Path) -> set[str]:
    done = set()
    for run_json in run_dir.glob("*/run.json"):
        try:
            status = json.loads(run_json.read_text()).get("status")
        except (OSError, ValueError):
            continue
        if status in set(UnitStatus) and UnitStatus(status).finished:
            done.add(run_json.parent.name)
    return done


def _secrets(experiment: Experiment) -> dict[str, str]:
    """Every secret the agents name, by variable name: the ones handed to agents (``secrets``) and the
    model API keys (``model.api_key_secret``, which only the model gateway holds; none when the run
    follows a model plan: its scripted server has a throwaway key of its own)."""
    values = {}
    for agent in experiment.agents:
        named = [(f"agent {agent.name}: secrets", name) for name in agent.secrets]
        if agent.model and agent.model.api_key_secret and experiment.model_plan is None:
            named.append((f"agent {agent.name}: model.api_key_secret", agent.model.api_key_secret))
        for where, name in named:
            if not os.environ.get(name):
                raise ConfigError(experiment.preset_file(agent), where, f"environment variable {name} is not set")
            values[name] = os.environ[name]
    return values


def bridge_tools() -> dict[str, dict[str, dict[str, Any]]]:
    """The vm and cua bridges' tools and their argument schemas, read from the servers themselves
    (built over a client factory that is never called: no sandbox needed)."""
    from ale_iac.bridges import cua, vm

    def no_sandbox() -> ComputerServerClient:
        raise AleIacError("no sandbox: this bridge was built only to list its tools")

    return {kind: dict(module.build_server(no_sandbox).tool_schemas) for kind, module in (("vm", vm), ("cua", cua))}


def check_agents(experiment: Experiment) -> None:
    """Everything about the agents that can be checked before a sandbox exists: the deployer imports,
    supports its executor, and accepts its settings (``BaseAgentDeployer.validate_config``)."""
    tools = bridge_tools()
    problems = Problems()
    for agent in experiment.agents:
        with problems.check():
            _check_agent(agent, tools, experiment.preset_file(agent))
    problems.raise_any()


def _check_agent(agent: AgentConfig, tools: ToolCatalog, source: Path | str) -> None:
    try:
        deployer_cls = load_deployer_class(agent)
    except ConfigError as exc:  # it names the agent; the preset file is what to open
        raise ConfigError(source, exc.field, exc.detail) from None
    kind = executor_kind(agent)
    executor_class(kind, agent.name).check_preset(agent, source)  # what it will ship and load where it runs
    if kind not in deployer_cls.supported_executors:
        raise ConfigError(
            source,
            "executor",
            f"agent {agent.name} does not support executor {kind!r} "
            f"(supported: {', '.join(sorted(deployer_cls.supported_executors))})",
        )
    if deployer_cls.model_api is not None and agent.model is None:
        raise ConfigError(
            source, "model", f"agent {agent.name} needs a model (its deployer speaks {deployer_cls.model_api})"
        )
    deployer_cls.validate_config(agent, tools)


def install_clis(experiment: Experiment, log: Callable[[str], None]) -> dict[str, dict[str, CliInstall]]:
    """The agent CLIs each agent's deployer declares, installed on this host (once; cached)."""
    from ale_iac.agent_sdk.clis import ensure_cli

    return {
        agent.name: {name: ensure_cli(name, log=log) for name in load_deployer_class(agent).clis}
        for agent in experiment.agents
    }


def _check_routes(experiment: Experiment, profile: Profile) -> None:
    """Every task's snapshot has a route in the profile (all the tasks that have none are named)."""
    problems = Problems()
    for task in experiment.tasks:
        try:
            profile.route(task.card.snapshot)
        except ConfigError as exc:
            problems.add(task.folder / task.card_file, _snapshot_field(task), exc.detail)
            continue
        try:
            policy_for(profile, task.card)
        except ValueError as exc:
            problems.add(task.folder / task.card_file, "egress", str(exc))
    problems.raise_any()


def _egress_of(profile: Profile | None) -> Callable[[UnitPlan, SandboxHandle], EgressPolicy | None]:
    """Each unit's egress policy: from the profile's route for its task, or (a pool run) from the leased unit's
    outputs (its route's, as the pool stack exported it); narrowed by the task's card either way."""
    if profile is None:
        return lambda plan, handle: leased_policy(handle, plan.task.card)
    return lambda plan, handle: policy_for(profile, plan.task.card)


def setup_record(experiment: Experiment, loaded: LoadedProfile | None) -> dict[str, Any]:
    """What the run's manifest says of where it ran, for reports and comparisons: the profile (and its file)
    or the pool, and each agent's executor and model."""
    return {
        "profile": loaded.profile.name if loaded else None,
        "profile_file": loaded.source if loaded else None,
        "pool": experiment.spec.pool,
        "shared_stack": experiment.spec.shared_stack,
        "agents": [
            {
                "name": agent.name,
                "executor": executor_kind(agent),
                "model": agent.model.name if agent.model else None,
                "model_base_url": agent.model.base_url if agent.model else None,
            }
            for agent in experiment.agents
        ],
    }


def _snapshot_field(task: Task) -> str:
    """Where a task's card names its snapshot (ALE's cards: under ``vm``)."""
    return "snapshot" if task.card_file == CARD_NAME else "vm.snapshot"


def executor_kind(agent: AgentConfig) -> str:
    """Where the agent's deployer runs: its preset's ``executor``, else its deployer's default."""
    return agent.executor or load_deployer_class(agent).default_executor


def warm_bridges(experiment: Experiment) -> WarmBridges | None:
    """The run's warm bridge process, when an agent runs on this host (``local``: its bridges start here)."""
    if not any(executor_kind(agent) == "local" for agent in experiment.agents):
        return None
    return WarmBridges()


def start_gateway(experiment: Experiment) -> ModelGateway | None:
    """The run's model gateway, if any agent uses a model."""
    if not any(agent.model for agent in experiment.agents):
        return None
    gateway = ModelGateway()
    gateway.start()
    return gateway


async def _run_all(
    plans: list[UnitPlan], ctx: RunContext, concurrency: int, progress: Progress
) -> tuple[list[UnitOutcome], bool]:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=max(8, concurrency * 3), thread_name_prefix="ale"))
    ctx.slots = asyncio.Semaphore(concurrency)
    ctx.ahead = asyncio.Semaphore(min(concurrency, PREPARED_AHEAD))
    results_path = ctx.run_dir / RESULTS
    outcomes: list[UnitOutcome] = []

    async def one(plan: UnitPlan) -> None:
        outcome = await run_unit(plan, ctx)
        outcomes.append(outcome)
        progress.finish(outcome)
        if outcome.status not in (UnitStatus.SUCCEEDED, UnitStatus.INTERRUPTED) and outcome.error:
            where = f" (the hook's traceback: {outcome.hook_traceback})" if outcome.hook_traceback else ""
            progress.console.print(
                f"[{outcome.unit_id}] {outcome.status}: {outcome.error}{where}", highlight=False, markup=False
            )
        with results_path.open("a") as handle:
            handle.write(json.dumps(ctx.redactor.json(outcome.as_result())) + "\n")

    tasks = [asyncio.create_task(one(p), name=p.unit_id) for p in plans]
    interrupts = _Interrupts(tasks, ctx.registry, progress.console)
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupts.on_signal, signum)
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return outcomes, interrupts.count > 0


@dataclass
class _Interrupts:
    """The first SIGINT/SIGTERM cancels every unit (each one's cleanup runs); a second one exits at once,
    naming the stacks left behind."""

    tasks: list[asyncio.Task[None]]
    registry: RunRegistry
    console: Console
    count: int = 0

    def on_signal(self, signum: int) -> None:
        self.count += 1
        if self.count == 1:
            self.console.print(
                f"\n[yellow]{signal.Signals(signum).name}: stopping; destroying in-flight units "
                "(interrupt again to leave them)[/yellow]"
            )
            for task in self.tasks:
                task.cancel()
            return
        left = self.registry.stacks
        self.console.print("\n[red]second interrupt: exiting without finishing cleanup[/red]")
        if left:
            self.console.print("stacks left behind: " + ", ".join(left))
            self.console.print("remove them with:  ale-iac gc")
        os._exit(130)


@dataclass
class _Sources:
    """Where the run's sandboxes come from: the engine, a pool to lease from (a pool stack's, or a static
    profile's endpoints) and/or the profile ephemeral stacks are made of, and what happens to them after."""

    engine: Engine
    pool: Pool | None
    profile: Profile | None
    cleanup: CleanupMode


@dataclass
class _RunRecord:
    """The run's record folder and the units this attempt runs (``--resume``: those not finished yet)."""

    run_id: str
    run_dir: Path
    plans: list[UnitPlan]
    skipped: list[str] = field(default_factory=list)


def _provisioners(
    sources: _Sources, run_id: str, registry: RunRegistry, spec: ExperimentSpec, shared: SharedStack | None
) -> Callable[[UnitPlan], Provisioner]:
    """Where each unit's sandbox comes from: a lease of the pool (a pool stack's, or a static profile's), of
    the run's shared stack, or an ephemeral stack of the profile."""
    pool, profile = sources.pool, sources.profile
    if pool is not None:
        return lambda _plan: PoolProvisioner(pool, lease_timeout_s=spec.unit_timeout_s)
    if shared is not None:
        return lambda plan: shared.provisioner_for(plan, spec.unit_timeout_s)
    if profile is None:
        raise AleIacError("an experiment needs a profile or a pool")
    return lambda _plan: StackProvisioner(sources.engine, profile, run_id, sources.cleanup, registry, spec.retain_below)


def _checked(experiment: Experiment) -> tuple[dict[str, str], LoadedProfile | None]:
    """Fail fast: whatever can be checked before a sandbox exists is checked before any is provisioned.
    Returns the secrets the agents name and the profile (none for a pool run)."""
    secrets_env = _secrets(experiment)
    check_agents(experiment)
    # A profile is a file too: checked now, before agent CLIs are installed or the engine starts.
    spec = experiment.spec
    loaded = None if spec.pool else resolve_profile(spec.profile or "local", named_in=experiment.source)
    if loaded is not None:
        _check_routes(experiment, loaded.profile)
        if spec.shared_stack:
            cleanup = spec.cleanup or loaded.profile.cleanup
            check_shared_stack(loaded.profile, experiment.units, cleanup, spec.retain_below, experiment.source)
    return secrets_env, loaded


def _say_dim(console: Console) -> Callable[[str], None]:
    return lambda line: console.print(f"[dim]{line}[/dim]", highlight=False)


def _read_pool(engine: Engine, experiment: Experiment) -> Pool:
    """The experiment's pool, read once per run (not per unit); every task's snapshot must have units in it."""
    assert experiment.spec.pool is not None
    pool = Pool.read(engine, experiment.spec.pool)
    problems = Problems()
    for task in experiment.tasks:
        try:
            names = pool.units_for(task.card.snapshot)
        except AleIacError as exc:
            problems.add(task.folder / task.card_file, _snapshot_field(task), str(exc))
            continue
        for name in names:  # a card that widens a unit's policy, or narrows one it lacks: refused now
            try:
                leased_policy(pool.units[name], task.card)
            except ValueError as exc:
                problems.add(task.folder / task.card_file, "egress", str(exc))
                break
    problems.raise_any()
    return pool


def _open_sources(experiment: Experiment, loaded: LoadedProfile | None, console: Console) -> _Sources:
    """The engine, and the pool or the profile (its images made ready)."""
    spec = experiment.spec
    engine = Engine()
    if spec.pool:
        return _Sources(engine, _read_pool(engine, experiment), None, spec.cleanup or CleanupMode.DESTROY)
    assert loaded is not None  # resolved before: not a pool run
    profile = loaded.profile
    pool = static_pool(profile, engine.backend_url)  # its endpoints are leased like a pool's units
    ensure_images(profile, log=_say_dim(console))
    return _Sources(engine, pool, profile, spec.cleanup or profile.cleanup)


def _resume_record(experiment: Experiment, engine: Engine, console: Console) -> _RunRecord:
    """The latest run of this experiment, if it is the same experiment: its crashed attempt's stacks destroyed,
    its finished units skipped."""
    run_dir = latest_run_dir(experiment)
    if run_dir is None:
        raise AleIacError(
            f"nothing to resume: no earlier run of '{experiment.spec.name}' under {experiment.output_root}"
        )
    manifest = json.loads((run_dir / MANIFEST).read_text())
    if manifest.get("fingerprint") != experiment.fingerprint():
        raise AleIacError(
            f"refusing to resume {run_dir}: the experiment changed since that run (agent presets or deployers, "
            "task cards, hooks, inputs or references, profile or repeats differ); start a new run without --resume"
        )
    run_id = manifest["run_id"]
    recover_crashed_attempt(
        run_id, lambda stack: destroy_stack(engine, stack), lambda line: console.print(line, highlight=False)
    )
    done = _finished_units(run_dir)
    plans = experiment.units
    record = _RunRecord(
        run_id, run_dir, [p for p in plans if p.unit_id not in done], [p.unit_id for p in plans if p.unit_id in done]
    )
    console.print(f"resuming {run_dir}: {len(record.skipped)} finished, {len(record.plans)} to run")
    return record


def _new_record(
    experiment: Experiment, loaded: LoadedProfile | None, cleanup: CleanupMode, redactor: Redactor
) -> _RunRecord:
    """A new run folder and its manifest (redacted): what runs, where, and the fingerprint ``--resume`` checks."""
    run_id, run_dir = _new_run_dir(experiment)
    run_dir.mkdir(parents=True, exist_ok=False)
    plans = experiment.units
    manifest = {
        "run_id": run_id,
        "fingerprint": experiment.fingerprint(),
        "experiment": str(experiment.source),
        "spec": experiment.spec.model_dump(mode="json"),
        "cleanup": cleanup.value,
        **setup_record(experiment, loaded),
        "units": [p.unit_id for p in plans],
        **({"model_plan": plan_record(experiment.model_plan)} if experiment.model_plan else {}),
    }
    (run_dir / MANIFEST).write_text(json.dumps(redactor.json(manifest), indent=2))
    return _RunRecord(run_id, run_dir, plans)


@contextmanager
def _shared_services(experiment: Experiment, ctx: RunContext, console: Console) -> Iterator[None]:
    """The services every unit of the run shares, started and closed around the units: the model plan's scripted
    server, the model gateway, the warm bridges (an optimisation: without them each bridge starts the slow way)."""
    warm = warm_bridges(experiment)
    plan_server = PlanServer(experiment.model_plan, ctx.run_dir / PLAN_LOG) if experiment.model_plan else None
    try:
        if plan_server is not None:
            ctx.redactor.add(plan_server.key)
            plan_server.start()
            ctx.model_upstream = plan_server.upstream
            ctx.model_plan = plan_record(plan_server.plan)
            console.print(f"model plan {plan_server.plan}: scripted model server on {ctx.model_upstream.root}")
        ctx.gateway = start_gateway(experiment)
        if warm is not None:
            try:
                warm.start()
                os.environ.update(warm.env)  # the agents' bridges (``ale-iac mcp``) find it there
            except (RuntimeError, OSError) as exc:  # an optimisation: bridges then start the slow way
                console.print(f"[yellow]warm bridges unavailable ({exc}); each bridge starts on its own[/yellow]")
        yield
    finally:
        if warm is not None:
            os.environ.pop(WARM_ENV, None)
            warm.close()
        if ctx.gateway is not None:
            ctx.gateway.close()
        if plan_server is not None:
            plan_server.close()


def _summary(record: _RunRecord, outcomes: list[UnitOutcome], interrupted: bool) -> RunSummary:
    outcomes.sort(key=lambda o: o.unit_id)
    ended = {o.unit_id for o in outcomes}
    return RunSummary(
        run_id=record.run_id,
        run_dir=record.run_dir,
        outcomes=outcomes,
        skipped=record.skipped,
        interrupted=interrupted,
        not_started=[p.unit_id for p in record.plans if p.unit_id not in ended],
    )


def run_experiment(
    experiment: Experiment,
    *,
    resume: bool = False,
    console: Console | None = None,
) -> RunSummary:
    console = console or Console()
    spec = experiment.spec
    secrets_env, loaded = _checked(experiment)
    redactor = Redactor(secrets_env.values())
    clis = install_clis(experiment, log=_say_dim(console))

    sources = _open_sources(experiment, loaded, console)
    if resume:
        record = _resume_record(experiment, sources.engine, console)
    else:
        record = _new_record(experiment, loaded, sources.cleanup, redactor)
    registry = RunRegistry(record.run_id, record.run_dir, keep_retained=resume)
    shared: SharedStack | None = None
    try:
        if spec.shared_stack:
            shared = _open_shared_stack(sources, record, registry, spec.concurrency, console)
        progress = Progress(
            record.plans, console, concurrency=spec.concurrency, title=f"ale-iac evaluate {record.run_id}"
        )
        ctx = RunContext(
            run_id=record.run_id,
            run_dir=record.run_dir,
            provisioner=_provisioners(sources, record.run_id, registry, spec, shared),
            cleanup=sources.cleanup,
            unit_timeout_s=spec.unit_timeout_s,
            registry=registry,
            redactor=redactor,
            secrets_env=secrets_env,
            on_phase=progress.phase,
            clis=clis,
            egress=_egress_of(sources.profile),
        )
        with _shared_services(experiment, ctx, console), progress.display():
            outcomes, interrupted = asyncio.run(_run_all(record.plans, ctx, spec.concurrency, progress))
    finally:
        if shared is not None:
            _close_shared_stack(shared, console)
        registry.close()
        sources.engine.close()
    return _summary(record, outcomes, interrupted)


def _open_shared_stack(
    sources: _Sources, record: _RunRecord, registry: RunRegistry, concurrency: int, console: Console
) -> SharedStack:
    """The run's shared stack, up before the first unit starts (``ale_iac.runner.shared_stack``; one whose ``up``
    fails is destroyed before the error propagates)."""
    assert sources.profile is not None  # checked: a profile run
    shared = SharedStack(sources.engine, sources.profile, record.run_id, registry)
    console.print(f"[dim]shared stack {shared.stack}: bringing it up[/dim]", highlight=False)
    shared.open(record.plans, concurrency)
    return shared


def _close_shared_stack(shared: SharedStack, console: Console) -> None:
    try:
        shared.close()
    except Exception as exc:
        console.print(
            f"[red]the shared stack ({', '.join(shared.stacks or [shared.stack])}) was not all destroyed: "
            f"{one_line(exc)} (remove what is left with: ale-iac gc)[/red]",
            highlight=False,
        )


def mean_line(outcomes: list[UnitOutcome]) -> str | None:
    """The mean score and how it was formed: which units it counts, which it leaves out and why."""
    graded = [o for o in outcomes if o.score is not None]
    if not graded:
        return None
    mean = sum(o.score or 0.0 for o in graded) / len(graded)
    line = f"mean score {mean:.3f} over {len(graded)} graded unit(s) of {len(outcomes)}"
    failed_agents = _counts(o.status for o in graded if o.status is not UnitStatus.SUCCEEDED)
    if failed_agents:
        line += f"; includes units whose agent did not complete, graded on what they left ({failed_agents})"
    ungraded = _counts(o.status for o in outcomes if o.score is None)
    if ungraded:
        line += f"; not graded, so not in the mean: {ungraded}"
    return line


def _counts(statuses: Iterable[str]) -> str:
    counts = Counter(statuses)
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


def print_summary(summary: RunSummary, console: Console) -> None:
    table = Table(
        "unit", "agent", "task", "status", "score", "time", "cleanup", "reason", title=f"results: {summary.run_dir}"
    )
    for o in summary.outcomes:
        table.add_row(
            o.unit_id,
            o.agent,
            o.task,
            o.status,
            "-" if o.score is None else f"{o.score:.2f}",
            f"{o.duration_s:.1f}s",
            o.cleanup,
            o.error or "",
        )
    console.print(table)
    if line := mean_line(summary.outcomes):
        console.print(line, highlight=False)
    if summary.skipped:
        console.print(f"skipped (already finished): {len(summary.skipped)}")
    for o in summary.retained:
        endpoint = (o.handle or {}).get("endpoint")
        console.print(f"retained: stack {o.stack} -> {endpoint}  (destroy: ale-iac sandbox destroy {o.stack})")
    if summary.retained:
        console.print(f"destroy everything this run retained: ale-iac sandbox destroy --run {summary.run_id}")
    for o in summary.outcomes:
        if o.hook_traceback:
            console.print(f"{o.unit_id}: a task hook raised; its traceback: {o.hook_traceback}", highlight=False)
    if summary.not_started:
        console.print(f"not started (the run was interrupted first): {len(summary.not_started)}")
    if summary.interrupted:
        console.print("[yellow]run was interrupted; rerun with --resume to finish it[/yellow]")


def exit_code(summary: RunSummary) -> int:
    """130 if interrupted; 0 if every unit run this time succeeded (its agent completed and it was graded,
    whatever the score); 1 otherwise (docs/experiments.md, "Exit code")."""
    if summary.interrupted:
        return 130
    return 0 if all(o.status is UnitStatus.SUCCEEDED for o in summary.outcomes) else 1
