"""One unit, start to finish (DESIGN §2):

    route -> stack up (or lease a pool unit) -> handle -> readiness -> stage inputs + setup
      -> deployer: install -> launch(prompt) -> parse_artifacts -> stage reference -> evaluate
      -> pull outputs -> record -> cleanup per mode (always, in a finally, also on cancel)

Every phase is timed into run.json and events.jsonl. A failure in any phase becomes the unit's
status; nothing escapes without the cleanup having run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ale_iac.agent import AgentRunResult, load_deployer_class
from ale_iac.engine import Engine
from ale_iac.errors import AleIacError
from ale_iac.executors import make_executor
from ale_iac.infra import UnitSpec
from ale_iac.profile import CleanupMode, Profile
from ale_iac.provision import UNIT_NAME, destroy_stack, new_stack_name, up_unit
from ale_iac.runner import leases
from ale_iac.runner.experiment import UnitPlan
from ale_iac.runner.records import Redactor, UnitRecord, utc_now
from ale_iac.runner.registry import RunRegistry
from ale_iac.runner.tasks import TaskSandbox, download_dir, upload_dir
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.sandbox.readiness import wait_ready

T = TypeVar("T")
HOOK_TIMEOUT_S = 300.0

# Unit statuses, in the order a unit can reach them.
PROVISION_FAILED = "provision_failed"
NOT_READY = "not_ready"
SETUP_FAILED = "setup_failed"
AGENT_FAILED = "agent_failed"
AGENT_TIMEOUT = "agent_timeout"
EVAL_FAILED = "eval_failed"
SUCCEEDED = "succeeded"
INTERRUPTED = "interrupted"


@dataclass
class RunContext:
    run_id: str
    run_dir: Path
    engine: Engine | None
    profile: Profile | None
    pool: str | None
    cleanup: CleanupMode
    unit_timeout_s: float
    registry: RunRegistry
    redactor: Redactor
    secrets_env: dict[str, str]
    on_phase: Callable[[str, str], None] = lambda unit, phase: None


@dataclass
class UnitOutcome:
    unit_id: str
    agent: str
    task: str
    repeat: int
    status: str
    score: float | None
    error: str | None
    stack: str | None
    cleanup: str
    duration_s: float
    agent_s: float
    handle: dict[str, Any] | None = field(default=None)

    def as_result(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "handle" or v is not None}


async def _blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run an engine call in a thread. If cancelled, still wait for the thread to finish, so the
    cleanup that follows never races a half-done ``pulumi up``."""
    future = asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await future
        raise


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if not isinstance(exc, AleIacError) else first


def build_prompt(instruction: str, sandbox: TaskSandbox) -> str:
    return (
        f"{instruction.strip()}\n\n"
        f"Input files are in {sandbox.input_dir} on the machine. "
        f"Write your results to {sandbox.output_dir}."
    )


async def run_unit(plan: UnitPlan, ctx: RunContext) -> UnitOutcome:
    record = UnitRecord(ctx.run_dir / plan.unit_id, ctx.redactor)
    task = plan.task
    started = time.monotonic()
    status, score, error = PROVISION_FAILED, None, None
    stack: str | None = None
    handle: SandboxHandle | None = None
    lease: leases.Lease | None = None
    agent_s = 0.0
    cleanup_outcome = "nothing to clean"
    record.write_run(
        unit_id=plan.unit_id,
        run_id=ctx.run_id,
        agent=plan.agent.model_dump(mode="json", exclude={"source_dir"}),
        task={"id": task.id, "folder": str(task.folder), "card": task.card.model_dump(mode="json")},
        repeat=plan.repeat,
        status="running",
        started_at=utc_now(),
        cleanup_mode=ctx.cleanup.value,
    )

    def phase(name: str) -> None:
        record.phase_start(name)
        ctx.on_phase(plan.unit_id, name)

    try:
        # -- provision ------------------------------------------------------------------------
        phase("provision")
        if ctx.pool:
            assert ctx.engine is not None
            units = await ctx.engine.units_async(ctx.pool)
            lease = await leases.lease(ctx.pool, units, ctx.unit_timeout_s)
            handle = SandboxHandle.from_outputs(ctx.pool, units[lease.unit])
            record.event("leased", stack=ctx.pool, unit=lease.unit)
        else:
            assert ctx.profile is not None and ctx.engine is not None
            snapshot, _ = ctx.profile.route(task.card.snapshot)
            stack = new_stack_name("run", ctx.run_id[-15:], plan.unit_id[-40:])
            ctx.registry.claim(stack)
            record.write_run(stack=stack)
            unit = UnitSpec(
                name=UNIT_NAME,
                snapshot=snapshot,
                shape=task.card.resources,
                labels={"run": ctx.run_id, "unit": plan.unit_id[-60:]},
            )
            handle = await _blocking(up_unit, ctx.engine, ctx.profile, stack, unit)
        token = handle.token()
        if token:
            ctx.redactor.add(token)  # an agent's logs could echo its bridge's environment
        record.phase_end("provision", stack=handle.stack, endpoint=handle.endpoint)
        record.write_run(handle=handle.summary())

        # -- readiness ------------------------------------------------------------------------
        status = NOT_READY
        phase("ready")
        timeout = ctx.profile.ready_timeout_s if ctx.profile else 120.0
        report = await wait_ready(handle, timeout)
        record.phase_end("ready", server_version=report.server_version, attempts=report.attempts)

        async with handle.client() as client:
            sandbox = TaskSandbox(handle, client, task.id)

            # -- stage inputs and setup ---------------------------------------------------------
            status = SETUP_FAILED
            phase("setup")
            await client.run_command(
                f"rm -rf '{sandbox.task_dir}' && mkdir -p '{sandbox.input_dir}' '{sandbox.output_dir}'"
            )
            staged = await upload_dir(client, task.input_dir, sandbox.input_dir) if task.input_dir.is_dir() else 0
            setup = task.hook("setup")
            if setup is not None:
                await asyncio.wait_for(setup(sandbox), HOOK_TIMEOUT_S)
            record.phase_end("setup", inputs_staged=staged)

            # -- the agent ----------------------------------------------------------------------
            status = AGENT_FAILED
            phase("agent")
            deployer_cls = load_deployer_class(plan.agent)
            kind = plan.agent.executor or deployer_cls.default_executor
            if kind not in deployer_cls.supported_executors:
                raise AleIacError(
                    f"agent {plan.agent.name} does not support executor {kind!r} "
                    f"(supported: {', '.join(sorted(deployer_cls.supported_executors))})"
                )
            record.agent_dir.mkdir(parents=True, exist_ok=True)
            executor = make_executor(
                kind,
                config=plan.agent,
                sandbox=handle,
                work_dir=record.agent_dir,
                env={name: ctx.secrets_env[name] for name in plan.agent.secrets},
                redact=ctx.redactor,
            )
            deployer = deployer_cls(executor)
            agent_start = time.monotonic()
            timeout_s = min(task.card.timeout_s or ctx.unit_timeout_s, ctx.unit_timeout_s)
            await deployer.install()
            try:
                result = await asyncio.wait_for(
                    deployer.launch(build_prompt(task.card.instruction, sandbox)), timeout_s
                )
            except TimeoutError:
                result = AgentRunResult(status="timeout", error=f"agent exceeded its {timeout_s:.0f} s limit")
            agent_s = time.monotonic() - agent_start
            result.duration_s = result.duration_s or agent_s
            try:
                trajectory = deployer.parse_artifacts(result)
                data = trajectory.model_dump(mode="json", exclude_none=True)
                # File references in the trajectory are relative to the agent's work dir.
                data["extra"] = {**data.get("extra", {}), "artifacts_dir": record.agent_dir.name}
                record.write_json("trajectory.json", data)
            except Exception as exc:
                record.event("trajectory_error", error=_one_line(exc))
            record.write_json("agent_result.json", result.model_dump(mode="json"))
            record.phase_end("agent", agent_status=result.status, error=result.error)
            agent_status = {"completed": SUCCEEDED, "failed": AGENT_FAILED, "timeout": AGENT_TIMEOUT}[result.status]
            if result.error:
                error = result.error

            # -- hidden reference, then grading ---------------------------------------------------
            status = EVAL_FAILED
            phase("evaluate")
            if task.reference_dir.is_dir():
                await upload_dir(client, task.reference_dir, sandbox.reference_dir)
            value = await asyncio.wait_for(task.module.evaluate(sandbox), HOOK_TIMEOUT_S)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
                raise AleIacError(f"evaluate() of task {task.id} returned {value!r}, not a number in [0, 1]")
            score = float(value)
            record.write_json("eval_result.json", {"score": score, "task": task.id, "evaluated_at": utc_now()})
            record.phase_end("evaluate", score=score)
            status = agent_status

            pulled = await download_dir(client, sandbox.output_dir, record.output_dir)
            record.event("outputs_pulled", files=pulled)
    except asyncio.CancelledError:
        status, error = INTERRUPTED, "interrupted"
        record.event("interrupted")
        raise
    except Exception as exc:
        error = _one_line(exc)
        record.event("error", status=status, error=error)
    finally:
        cleanup_outcome = await _cleanup(ctx, record, status, stack, lease)
        duration = time.monotonic() - started
        retained = handle.summary() if handle is not None and cleanup_outcome == "retained" else None
        record.write_run(
            status=status,
            score=score,
            error=error,
            stack=stack,
            cleanup={"mode": ctx.cleanup.value, "outcome": cleanup_outcome},
            finished_at=utc_now(),
            duration_s=round(duration, 3),
            agent_s=round(agent_s, 3),
        )
        ctx.redactor.scrub_tree(record.folder)
        record.close()
        ctx.on_phase(plan.unit_id, "done")
    return UnitOutcome(
        unit_id=plan.unit_id,
        agent=plan.agent.name,
        task=task.id,
        repeat=plan.repeat,
        status=status,
        score=score,
        error=error,
        stack=stack,
        cleanup=cleanup_outcome,
        duration_s=round(duration, 3),
        agent_s=round(agent_s, 3),
        handle=retained,
    )


async def _cleanup(
    ctx: RunContext, record: UnitRecord, status: str, stack: str | None, lease: leases.Lease | None
) -> str:
    """Apply the cleanup mode. Runs on every path, including cancellation."""
    record.phase_start("cleanup")
    if lease is not None:
        lease.release()
        record.phase_end("cleanup", outcome="lease released")
        return "lease released"
    if stack is None or ctx.engine is None:
        record.phase_end("cleanup", outcome="nothing to clean")
        return "nothing to clean"
    retain = ctx.cleanup is CleanupMode.RETAIN or (ctx.cleanup is CleanupMode.RETAIN_ON_FAILURE and status != SUCCEEDED)
    if retain:
        ctx.registry.retain(stack)
        record.phase_end("cleanup", outcome="retained")
        return "retained"
    try:
        existed = await _blocking(destroy_stack, ctx.engine, stack)
    except Exception as exc:
        record.phase_end("cleanup", ok=False, error=_one_line(exc))
        return f"destroy failed: {_one_line(exc)} (run: ale-iac gc)"
    ctx.registry.release(stack)
    outcome = "destroyed" if existed else "no stack was created"
    record.phase_end("cleanup", outcome=outcome)
    return outcome
