"""What a unit's sandbox was limited to, and whether its memory limit killed anything.

Host substrates with :attr:`~ale_iac.substrates.base.Capability.LIMITS` know this (``Substrate.limits``): each
limit requested, applied or not and how, and, where the substrate counts them, the processes the kernel's OOM
killer took. The stack's outputs do not carry them (``UnitOutputs`` is what every provider shares), so the
runner reads the substrate's, by the handle's ``resource_id``, at the end of the unit: before its release,
which destroys or resets the sandbox and with it the count. Other providers record nothing.
"""

from __future__ import annotations

from ale_iac.errors import AleIacError
from ale_iac.runner.records import UnitRecord
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates import registry
from ale_iac.substrates.base import Capability


def record_limits(handle: SandboxHandle | None, record: UnitRecord) -> str | None:
    """Write the sandbox's ``limits`` (and ``oom_kills`` where counted) into the unit's run.json; when its
    memory limit killed a process, also the event ``oom_killed``. Returns a line saying so for the unit's error
    (None when nothing was killed or nothing is known)."""
    substrate = registry.of_unit(handle) if handle is not None else None
    if handle is None or substrate is None or Capability.LIMITS not in substrate.capabilities:
        return None
    try:
        found = substrate.limits(handle)
    except (OSError, ValueError, AleIacError) as exc:
        record.event("limits_unknown", error=str(exc))
        return None
    if found is None:
        return None
    limits = [limit.model_dump() for limit in found.limits]
    if found.oom_kills is None:
        record.write_run(limits=limits)
        return None
    kills = found.oom_kills
    record.write_run(limits=limits, oom_kills=kills)
    if kills == 0:
        return None
    memory = next((limit for limit in found.limits if limit.name == "memory_gb"), None)
    limit_gb = memory.requested if memory is not None else None
    record.event("oom_killed", oom_kills=kills, memory_gb=limit_gb)
    plural = "process" if kills == 1 else "processes"
    return f"the sandbox's memory limit ({limit_gb or '?'} GiB) killed {kills} {plural} (out of memory)"
