"""The ``local`` substrate's unit as the isolation suite sees it from the host (``ale_iac.substrates.isolation``).

The reference substrate: every check of the suite applies to it.
"""

from __future__ import annotations

from pathlib import Path

from ale_iac.substrates import isolation
from ale_iac.substrates.local import sandboxes
from ale_iac.substrates.local.sandboxes import LocalSandboxState

_NO_HOST_PROCESS = "no host process stands for the unit: every process of it runs inside its namespaces"
NOT_APPLICABLE = {
    isolation.HOST_PROCESS_CONFINED: _NO_HOST_PROCESS,
    isolation.HOST_PROCESS_UNPRIVILEGED: _NO_HOST_PROCESS + " (as an unprivileged host id: root-is-unprivileged)",
}


class LocalIsolation:
    """``owner``: the host user that started the sandbox (its state folders are that user's)."""

    def __init__(self, state: LocalSandboxState, owner: int = 0) -> None:
        self.state = state
        self.owner = owner

    def host_pids(self) -> list[int]:
        return sandboxes.sandbox_pids(self.state)

    def host_paths(self) -> list[Path]:
        return [Path(self.state.state_dir)]

    def read_log(self, name: str) -> str:
        return sandboxes.log_text(self.state, name)

    def tasks_in_use(self) -> int:
        folder = next((Path(p) for p in self.state.cgroups if (Path(p) / "pids.current").exists()), None)
        if folder is None:  # bounded by RLIMIT_NPROC in its user namespace: count its tasks
            return isolation.threads_of(self.host_pids())
        return int((folder / "pids.current").read_text())

    def not_applicable(self, check: str) -> str | None:
        isolation.unknown_check(check)
        return NOT_APPLICABLE.get(check)
