"""One unit, start to finish:

    load the task (ALE: load() once) -> provision (stack up, or lease a pool unit) -> readiness
      -> stage inputs + setup
      -> deployer: install -> launch(prompt) -> parse_artifacts -> stage reference -> evaluate
      -> pull outputs -> record -> release per cleanup mode (always, in a finally, also on cancel)

The run's concurrency (``RunContext.slots``) bounds units from load to pulled outputs; the release
(a stack's destroy, a pool unit's reset) runs after the unit gave its slot back, so the next unit starts
while this one is cleaned up. The unit's record still waits for the cleanup's outcome.

Every phase is timed into run.json and events.jsonl, and names the status the unit ends in if it
fails (:meth:`_Unit.phase`). Nothing escapes without the release having run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ale_iac.agent_sdk import (
    AgentRunResult,
    CliInstall,
    ModelApi,
    ModelGrant,
    TaskPaths,
    load_deployer_class,
    make_executor,
)
from ale_iac.clock import utc_now
from ale_iac.egress_policy import EgressPolicy
from ale_iac.errors import AleIacError, one_line
from ale_iac.llm.gateway import ModelGateway
from ale_iac.profile import CleanupMode
from ale_iac.runner import hook_output
from ale_iac.runner.egress import blame_refusals, close_egress, open_egress
from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.model_plan import ModelUpstream, plan_error_in
from ale_iac.runner.provisioners import RETAINED, Provisioner
from ale_iac.runner.records import Redactor, UnitRecord
from ale_iac.runner.run_claims import RunRegistry
from ale_iac.runner.status import AGENT_OUTCOME, UnitStatus
from ale_iac.runner.tasks import TaskDataMissingError, UnitTask, collect_dir
from ale_iac.runner.unit_limits import record_limits
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready
from ale_iac.substrates.egress import UnitEgress
from ale_iac.task import Evaluation, TaskSandbox

HOOK_TIMEOUT_S = 300.0
BACKSTOP_S = 120.0
"""How long past the agent's limit the runner waits for an executor that overruns it, before cancelling."""
MODEL_USAGE = "model_usage.json"
"""Per unit: what the model gateway served it (requests, tokens, errors, latency), measured at the gateway."""
HOOKS_LOG = "hooks.log"


@dataclass
class RunContext:
    run_id: str
    run_dir: Path
    provisioner: Callable[[UnitPlan], Provisioner]
    """A fresh provisioner for each unit, made for its plan."""
    registry: RunRegistry
    """The stacks this run claimed (what a second interrupt reports as left behind)."""
    cleanup: CleanupMode
    unit_timeout_s: float
    redactor: Redactor
    secrets_env: dict[str, str]
    on_phase: Callable[[str, str], None] = lambda unit, phase: None
    clis: dict[str, dict[str, CliInstall]] = field(default_factory=dict)
    """Per agent name: the agent CLIs its deployer declared, installed on this host."""
    gateway: ModelGateway | None = None
    """The run's model gateway (None when no agent uses a model)."""
    slots: asyncio.Semaphore | None = None
    """The run's concurrency: held from load until outputs are pulled, not during cleanup (None: no bound)."""
    ahead: asyncio.Semaphore | None = None
    """How many units waiting for a slot may prepare (make their stack) ahead of it (None: none do)."""
    model_upstream: ModelUpstream | None = None
    """Where every model grant goes instead of its preset's upstream: the run's scripted model server, when
    the run follows a model plan (``evaluate --model-plan``)."""
    egress: Callable[[UnitPlan, SandboxHandle], EgressPolicy | None] = lambda plan, handle: None
    """Each unit's egress policy (its route's, narrowed by its task card's), asked once its sandbox is ready (a
    pool lease's is known only then: the leased unit's outputs carry it); None: no network."""
    model_plan: dict[str, Any] | None = None
    """The plan the run follows (its file and hash), recorded in each unit's run.json."""


@dataclass
class UnitOutcome:
    unit_id: str
    agent: str
    task: str
    repeat: int
    status: UnitStatus
    score: float | None
    error: str | None
    stack: str | None
    cleanup: str
    duration_s: float
    agent_s: float
    handle: dict[str, Any] | None = field(default=None)
    hook_traceback: str | None = None
    """The unit's ``hooks.log``, when a task hook raised: its traceback is there."""

    def as_result(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("handle", "hook_traceback") or v is not None}


def build_prompt(instruction: str, sandbox: TaskSandbox) -> str:
    return (
        f"{instruction.strip()}\n\n"
        f"Input files are in {sandbox.input_dir} on the machine. "
        f"Write your results to {sandbox.output_dir}."
    )


class _Unit:
    """One unit while it runs: its record, status, score and error, and its phases."""

    def __init__(self, plan: UnitPlan, ctx: RunContext) -> None:
        self.plan, self.ctx = plan, ctx
        self.record = UnitRecord(ctx.run_dir / plan.unit_id, ctx.redactor)
        self.started = time.monotonic()
        self.status = UnitStatus.RUNNING
        self.score: float | None = None
        self.error: str | None = None
        self.agent_s = 0.0
        self.handle: SandboxHandle | None = None
        self.egress: UnitEgress | None = None
        task = plan.task
        previous = self.record.previous_run()
        self.attempt = int(previous.get("attempt", 1)) + 1 if previous else 1
        if previous:
            # --resume after a crash: the earlier attempt's events stay, this marks where the new one starts.
            self.record.event(
                "attempt",
                attempt=self.attempt,
                previous_status=previous.get("status"),
                previous_stack=previous.get("stack"),
            )
        self.record.write_run(
            unit_id=plan.unit_id,
            attempt=self.attempt,
            run_id=ctx.run_id,
            agent=plan.agent.model_dump(mode="json", exclude={"source_dir"}),
            task={"id": task.id, "folder": str(task.folder), "card": task.card.model_dump(mode="json")},
            repeat=plan.repeat,
            status=self.status,
            started_at=utc_now(),
            cleanup_mode=ctx.cleanup.value,
            **({"model_plan": ctx.model_plan} if ctx.model_plan is not None else {}),
        )

    @contextlib.asynccontextmanager
    async def phase(self, name: str, fails_as: UnitStatus) -> AsyncIterator[dict[str, Any]]:
        """Time phase ``name`` into the record; if anything in it raises, the unit ends ``fails_as`` and
        the phase is recorded ``ok: false`` with the error. Yields a dict for the details recorded with
        the phase's end (``ok`` in it overrides the phase's ``ok``)."""
        self.status = fails_as
        self.record.phase_start(name)
        self.ctx.on_phase(self.plan.unit_id, name)
        details: dict[str, Any] = {}
        try:
            yield details
        except asyncio.CancelledError:
            self.record.phase_end(name, ok=False, **{**details, "error": "interrupted"})
            raise
        except Exception as exc:
            self.record.phase_end(name, ok=False, **{**details, "error": one_line(exc)})
            raise
        ok = bool(details.pop("ok", True))
        self.record.phase_end(name, ok=ok, **details)

    def failed(self, exc: BaseException) -> None:
        # An agent's own error (set before grading) stays first: it is why the unit ended this way.
        self.error = one_line(exc) if self.error is None else f"{self.error}; then {one_line(exc)}"
        self.record.event("error", status=self.status, error=self.error)

    def interrupted(self) -> None:
        self.status, self.error = UnitStatus.INTERRUPTED, "interrupted"
        self.record.event("interrupted")

    async def release(self, provisioner: Provisioner, handle: SandboxHandle | None) -> UnitOutcome:
        if self.egress is not None:  # before the cleanup: its channel goes through the unit's endpoint
            try:
                await close_egress(self.egress, self.record)
            except Exception as exc:  # no failure of the cleanup, but on the record (what is left, gc sweeps)
                folder = self.egress.folder
                self.record.event(
                    "egress_close_failed", error=one_line(exc), left_for_gc=str(folder) if folder.exists() else None
                )
        # Before the cleanup: a destroy or a reset takes the sandbox's limits and its count of OOM kills.
        if (oom := record_limits(handle, self.record)) and self.status is not UnitStatus.SUCCEEDED:
            self.error = oom if self.error is None else f"{self.error}; {oom}"
        self.record.phase_start("cleanup")
        try:
            outcome = await provisioner.release(self.status, self.score)
        finally:
            if handle is not None:  # destroyed, retained or back in its pool: this run is done with it
                await asyncio.to_thread(handle.close_port_forward)
        self.record.phase_end("cleanup", outcome=outcome)
        duration = round(time.monotonic() - self.started, 3)
        self.record.write_run(
            status=self.status,
            score=self.score,
            error=self.error,
            stack=provisioner.stack,
            cleanup={"mode": self.ctx.cleanup.value, "outcome": outcome},
            finished_at=utc_now(),
            duration_s=duration,
            agent_s=round(self.agent_s, 3),
        )
        self.ctx.redactor.scrub_tree(self.record.folder)
        self.record.close()
        self.ctx.on_phase(self.plan.unit_id, "done")
        return UnitOutcome(
            unit_id=self.plan.unit_id,
            agent=self.plan.agent.name,
            task=self.plan.task.id,
            repeat=self.plan.repeat,
            status=self.status,
            score=self.score,
            error=self.error,
            stack=provisioner.stack,
            cleanup=outcome,
            duration_s=duration,
            agent_s=round(self.agent_s, 3),
            handle=handle.summary() if handle is not None and outcome == RETAINED else None,
            hook_traceback=str(self.record.folder / HOOKS_LOG) if self.record.event_counts["hook_error"] else None,
        )


async def run_unit(plan: UnitPlan, ctx: RunContext) -> UnitOutcome:
    """One unit from its slot to its release. A unit cancelled once it has started (the run was interrupted)
    is released like any other and returns its outcome, ``interrupted``: the cancellation ends here, so the
    run's summary lists it. One cancelled while it waits for its slot raises ``CancelledError``: it never
    started, and has no record."""
    slot = _Slot(ctx.slots)
    provisioner = ctx.provisioner(plan)
    try:
        await _prepare_then_take(provisioner, plan, ctx, slot)
        unit = _Unit(plan, ctx)
    except BaseException:
        slot.give_back()
        await _shielded(provisioner.discard())
        raise
    try:
        try:
            await _work(unit, provisioner)
        finally:
            slot.give_back()  # the cleanup below runs outside the run's concurrency
    except asyncio.CancelledError:
        unit.interrupted()
        if (task := asyncio.current_task()) is not None:
            task.uncancel()  # handled: the unit ends interrupted, and says so
    except Exception as exc:
        unit.failed(exc)
    finally:
        outcome = await unit.release(provisioner, unit.handle)
    return outcome


async def _prepare_then_take(provisioner: Provisioner, plan: UnitPlan, ctx: RunContext, slot: _Slot) -> None:
    """Take the unit's slot; a unit that has to wait for one first runs its provisioner's
    :meth:`~Provisioner.prepare` (an ephemeral unit's ``stack init``), so that work is off its critical path.
    ``ctx.ahead`` bounds how many waiting units prepare (a unit that gets a slot at once prepares nothing:
    there is no wait to hide it in)."""
    if ctx.slots is None or not ctx.slots.locked() or ctx.ahead is None:
        await slot.take()
        return
    async with ctx.ahead:
        await provisioner.prepare(plan)
        await slot.take()


async def _shielded(cleanup: Awaitable[None]) -> None:
    """Run ``cleanup`` to its end even if the caller is being cancelled."""
    future = asyncio.ensure_future(cleanup)
    try:
        await asyncio.shield(future)
    except asyncio.CancelledError:
        await future
        raise


class _Slot:
    """A unit's place in the run's concurrency, given back once (or never taken when there is no bound)."""

    def __init__(self, slots: asyncio.Semaphore | None) -> None:
        self._slots = slots
        self._held = False

    async def take(self) -> None:
        if self._slots is not None:
            await self._slots.acquire()
            self._held = True

    def give_back(self) -> None:
        if self._slots is not None and self._held:
            self._held = False
            self._slots.release()


async def _work(unit: _Unit, provisioner: Provisioner) -> None:
    """Everything of a unit but its release: load, provision, ready, setup, agent, evaluate, pull outputs."""
    plan, ctx = unit.plan, unit.ctx
    async with unit.phase("load", UnitStatus.SETUP_FAILED) as done:
        try:
            task = plan.task.for_unit()  # ALE's format: load() runs here, once per unit
        except TaskDataMissingError:
            unit.status = UnitStatus.TASK_DATA_MISSING
            raise
        done.update(task.describe())
    async with unit.phase("provision", UnitStatus.PROVISION_FAILED) as done:
        handle = unit.handle = await provisioner.acquire(plan, unit.record)
        if token := handle.token():
            ctx.redactor.add(token)  # an agent's logs could echo its bridge's environment
        done.update(stack=handle.stack, endpoint=handle.endpoint)
        unit.record.write_run(handle=handle.summary())
    async with unit.phase("ready", UnitStatus.NOT_READY) as done:
        report = await wait_ready(handle, provisioner.ready_timeout_s)
        done.update(server_version=report.server_version, attempts=report.attempts)
    if (policy := ctx.egress(plan, handle)) is not None:
        async with unit.phase("egress", UnitStatus.NOT_READY) as done:
            unit.egress = await open_egress(handle, policy)
            done["policy"] = policy.summary()
        # From here on, every command started in the unit sees the proxy variables (SandboxHandle.command_env).
        handle = unit.handle = handle.with_egress(policy.model_dump(mode="json"))
    async with handle.client() as client:
        sandbox = task.bind(handle, client)
        async with unit.phase("setup", UnitStatus.SETUP_FAILED) as done:
            with blame_refusals(unit.egress):
                done["inputs_staged"] = await _stage_and_set_up(task, sandbox, unit.record)
        async with unit.phase("agent", UnitStatus.AGENT_FAILED) as done:
            started = time.monotonic()
            result = await _run_agent(plan, ctx, handle, sandbox, unit.record, task.instruction)
            unit.agent_s = time.monotonic() - started
            done.update(ok=result.status == "completed", agent_status=result.status, error=result.error)
        unit.error = result.error
        # A unit whose agent failed is still graded (partial work counts); it keeps the agent's status.
        agent_outcome = AGENT_OUTCOME[result.status]
        fails_as = UnitStatus.EVAL_FAILED if agent_outcome is UnitStatus.SUCCEEDED else agent_outcome
        async with unit.phase("evaluate", fails_as) as done:
            done["score"] = unit.score = await _grade(task, sandbox, unit.record)
        unit.status = agent_outcome
        unit.record.event(
            "outputs_pulled", files=await collect_dir(sandbox, sandbox.output_dir, unit.record.output_dir)
        )


async def _stage_and_set_up(task: UnitTask, sandbox: TaskSandbox, record: UnitRecord) -> int:
    """A clean task folder in the sandbox, the task's inputs in it, then the task's ``setup`` hook."""
    staged = await task.stage_inputs(sandbox)
    if task.hook("setup") is not None:
        await call_hook(task, "setup", sandbox, record)
    return staged


async def call_hook(task: UnitTask, name: str, sandbox: TaskSandbox, record: UnitRecord) -> Any:
    """Run a task hook within its time limit. What it prints or logs goes to the unit's ``hooks.log``;
    if it raises, its traceback goes there and into ``events.jsonl`` (``hook_error``)."""
    fn = task.hook(name)
    if fn is None:
        raise AleIacError(f"task {task.id} has no {name} hook")
    with hook_output.capture() as output:
        try:
            async with asyncio.timeout(HOOK_TIMEOUT_S):  # not wait_for: it can drop a cancel (gh-86296)
                return await fn(sandbox)
        except TimeoutError:
            raise AleIacError(f"the {name} hook of task {task.id} exceeded its {HOOK_TIMEOUT_S:.0f} s limit") from None
        except Exception as exc:
            trace = "".join(traceback.format_exception(exc))
            output.write(trace)
            record.event("hook_error", hook=name, error=one_line(exc), traceback=trace)
            raise
        finally:
            text = output.getvalue()
            if text:
                record.append_text(HOOKS_LOG, f"--- {name} ({utc_now()}) ---\n{text.rstrip()}\n")
                record.event("hook_output", hook=name, file=HOOKS_LOG, chars=len(text))


async def _run_agent(
    plan: UnitPlan, ctx: RunContext, handle: SandboxHandle, sandbox: TaskSandbox, record: UnitRecord, instruction: str
) -> AgentRunResult:
    """The deployer through its executor: install, launch (within the time limit), parse artifacts."""
    deployer_cls = load_deployer_class(plan.agent)
    kind = plan.agent.executor or deployer_cls.default_executor
    if kind not in deployer_cls.supported_executors:
        raise AleIacError(
            f"agent {plan.agent.name} does not support executor {kind!r} "
            f"(supported: {', '.join(sorted(deployer_cls.supported_executors))})"
        )
    record.agent_dir.mkdir(parents=True, exist_ok=True)
    grant = _model_grant(plan, ctx, deployer_cls.model_api)
    executor = make_executor(
        kind,
        config=plan.agent,
        sandbox=handle,
        work_dir=record.agent_dir,
        env={name: ctx.secrets_env[name] for name in plan.agent.secrets},
        redact=ctx.redactor,
        task=TaskPaths(task_id=plan.task.id, input_dir=sandbox.input_dir, output_dir=sandbox.output_dir),
        model=grant,
        clis=ctx.clis.get(plan.agent.name, {}),
    )
    deployer = deployer_cls(executor)
    timeout_s = min(plan.task.card.timeout_s or ctx.unit_timeout_s, ctx.unit_timeout_s)
    prompt = build_prompt(instruction, sandbox)
    started = time.monotonic()
    try:
        # The executor enforces timeout_s itself (and kills what it started); this is a backstop.
        async with asyncio.timeout(timeout_s + BACKSTOP_S):  # not wait_for: it can drop a cancel (gh-86296)
            result = await executor.run_deployer(deployer, prompt, timeout_s)
    except TimeoutError:
        result = AgentRunResult(status="timeout", error=f"agent exceeded its {timeout_s:.0f} s limit")
    except Exception as exc:  # the deployer raised: a failed run (still graded), with its traceback
        record.event("agent_error", error=one_line(exc), traceback="".join(traceback.format_exception(exc)))
        result = AgentRunResult(status="failed", error=f"agent raised {one_line(exc)}")
    finally:
        plan_error = _record_model_usage(plan, ctx, record) if grant is not None else None
    if plan_error is not None:
        # The model could not follow its plan: whatever the agent made of that answer, the unit's agent failed.
        record.event("plan_error", error=plan_error, agent_status=result.status, agent_error=result.error)
        result = result.model_copy(update={"status": "failed", "error": plan_error})
    result.duration_s = result.duration_s or time.monotonic() - started
    try:
        data = deployer.parse_artifacts(result).model_dump(mode="json", exclude_none=True)
        record.write_json("trajectory.json", relative_to_record(data, record.agent_dir.name))
    except Exception as exc:
        record.event("trajectory_error", error=one_line(exc))
    record.write_json("agent_result.json", result.model_dump(mode="json"))
    return result


def _record_model_usage(plan: UnitPlan, ctx: RunContext, record: UnitRecord) -> str | None:
    """End the unit's grant and record what went through it; returns the plan error the upstream
    answered, if any (only a scripted model server gives one)."""
    if ctx.gateway is None:
        return None
    usage = ctx.gateway.usage(plan.unit_id)
    ctx.gateway.revoke(plan.unit_id)
    record.write_json(MODEL_USAGE, usage)
    record.event(
        "model_usage",
        requests=usage.get("requests"),
        errors=usage.get("errors"),
        refused=usage.get("refused"),
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
    )
    return plan_error_in(usage)


def _model_grant(plan: UnitPlan, ctx: RunContext, deployer_api: ModelApi | None) -> ModelGrant | None:
    """The unit's grant on the run's model gateway: a per-unit token in place of the real key."""
    model = plan.agent.model
    if model is None or ctx.gateway is None:
        return None
    api = model.api or deployer_api
    if api is None:
        raise AleIacError(f"agent {plan.agent.name}: model.api is not set and its deployer names no API")
    name = model.name
    upstream: str | None
    api_key: str | None
    if ctx.model_upstream is not None:  # the run follows a model plan: its scripted server is every upstream
        upstream, api_key = ctx.model_upstream.base_url(api), ctx.model_upstream.api_key
        name = model.scripted_name or model.name
    else:
        upstream = model.base_url
        api_key = ctx.secrets_env.get(model.api_key_secret) if model.api_key_secret else None
    grant = ctx.gateway.grant(plan.unit_id, api=api, upstream_base_url=upstream, api_key=api_key)
    return ModelGrant(
        api=api,
        model=name,
        token=grant.token,
        tcp_root=ctx.gateway.tcp_root,
        attach_unix=grant.attach_unix,
        on_revoke=grant.on_revoke,
    )


def relative_to_record(trajectory: dict[str, Any], agent_dir: str) -> dict[str, Any]:
    """A deployer names its screenshots relative to its work dir; in the record they are relative to
    ``trajectory.json`` (``agent/screenshots/...``), and ``extra.artifacts_dir`` says so (``.``)."""

    def rebase(extra: Any) -> None:
        if isinstance(extra, dict) and isinstance(extra.get("screenshots"), list):
            extra["screenshots"] = [f"{agent_dir}/{p}" if isinstance(p, str) else p for p in extra["screenshots"]]

    for step in trajectory.get("steps", []):
        rebase(step.get("extra"))
        for result in (step.get("observation") or {}).get("results", []):
            rebase(result.get("extra"))
    trajectory["extra"] = {**trajectory.get("extra", {}), "artifacts_dir": "."}
    return trajectory


async def _grade(task: UnitTask, sandbox: TaskSandbox, record: UnitRecord) -> float:
    """Stage the hidden reference, then run the task's ``evaluate``: a number in [0, 1], or an
    :class:`Evaluation` (the score and its details, such as partial credit per criterion)."""
    await task.stage_reference(sandbox)
    value = await call_hook(task, "evaluate", sandbox, record)
    details: dict[str, Any] = {}
    if isinstance(value, Evaluation):
        details = dict(value.details)
        value = value.score
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise AleIacError(f"evaluate() of task {task.id} returned {value!r}, not a number in [0, 1]")
    score = float(value)
    result: dict[str, Any] = {"score": score, "task": task.id, "evaluated_at": utc_now()}
    if details:
        result["details"] = details
    record.write_json("eval_result.json", result)
    return score
