"""What became of a unit: the statuses a unit can end in, in the order it can reach them."""

from __future__ import annotations

from enum import StrEnum


class UnitStatus(StrEnum):
    RUNNING = "running"
    PROVISION_FAILED = "provision_failed"
    NOT_READY = "not_ready"
    TASK_DATA_MISSING = "task_data_missing"
    SETUP_FAILED = "setup_failed"
    AGENT_FAILED = "agent_failed"
    AGENT_TIMEOUT = "agent_timeout"
    EVAL_FAILED = "eval_failed"
    SUCCEEDED = "succeeded"
    INTERRUPTED = "interrupted"

    @property
    def finished(self) -> bool:
        """A unit that ended this way is not run again by ``--resume``."""
        return self not in (UnitStatus.RUNNING, UnitStatus.INTERRUPTED)


AGENT_OUTCOME = {
    "completed": UnitStatus.SUCCEEDED,
    "failed": UnitStatus.AGENT_FAILED,
    "timeout": UnitStatus.AGENT_TIMEOUT,
}
"""A graded unit's status, from its agent's run status."""
