"""What a unit's sandbox was limited to, and whether its memory limit killed anything.

The host substrates know this. ``local``: its state dir keeps the limits it applied (each requested,
applied or not, and how), and its memory cgroup counts the processes the kernel's OOM killer took.
``docker``: its container's label records the limits (a shape larger than the host fitted to it, with
the numbers). The stack's outputs do not carry them (``UnitOutputs`` is what every provider shares), so
the runner reads the sandbox's, by the handle's ``resource_id``, at the end of the unit: before its
release, which destroys or resets the sandbox and with it the count. Other providers record nothing.
"""

from __future__ import annotations

from dataclasses import asdict

from ale_iac.errors import AleIacError
from ale_iac.runner.records import UnitRecord
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.docker import runtime as docker_runtime
from ale_iac.substrates.local import runtime as local_runtime


def record_limits(handle: SandboxHandle | None, record: UnitRecord) -> str | None:
    """Write the sandbox's ``limits`` and ``oom_kills`` into the unit's run.json; when its memory limit
    killed a process, also the event ``oom_killed``. Returns a line saying so for the unit's error (None
    when nothing was killed or nothing is known)."""
    if handle is None or not handle.managed:
        return None
    if handle.provider == "docker":
        _record_docker_limits(handle, record)
        return None
    if handle.provider != "local":
        return None
    try:
        state = local_runtime.load_state(handle.resource_id)
        kills = local_runtime.oom_kills(state) if state is not None else 0
    except (OSError, ValueError, AleIacError) as exc:
        record.event("limits_unknown", error=str(exc))
        return None
    if state is None:
        return None
    record.write_run(limits=[asdict(limit) for limit in state.limits], oom_kills=kills)
    if kills == 0:
        return None
    memory = next((limit for limit in state.limits if limit.name == "memory_gb"), None)
    limit_gb = memory.requested if memory is not None else None
    record.event("oom_killed", oom_kills=kills, memory_gb=limit_gb)
    plural = "process" if kills == 1 else "processes"
    return f"the sandbox's memory limit ({limit_gb or '?'} GiB) killed {kills} {plural} (out of memory)"


def _record_docker_limits(handle: SandboxHandle, record: UnitRecord) -> None:
    try:
        limits = docker_runtime.limits_of(handle.resource_id)
    except (OSError, ValueError, AleIacError) as exc:
        record.event("limits_unknown", error=str(exc))
        return
    if limits is not None:
        record.write_run(limits=[asdict(limit) for limit in limits])
