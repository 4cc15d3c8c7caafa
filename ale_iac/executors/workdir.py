"""The host side of a unit's work dir, shared by every executor: the folder the runner stores as the
unit's ``agent/`` record. The ``local`` executor's deployer writes it directly; the ``sandbox`` and
``docker`` executors fill it with what the agent wrote where it ran, and ``parse_artifacts`` reads it
here on the host."""

from __future__ import annotations

from pathlib import Path

from ale_iac.agent_sdk.executor import BaseExecutor


class HostWorkDir(BaseExecutor):
    """File I/O in ``work_dir`` on this host; text is redacted on the way in. Paths never leave it."""

    def _path(self, relpath: str) -> Path:
        path = (self.work_dir / relpath).resolve()
        if not path.is_relative_to(self.work_dir.resolve()):
            raise ValueError(f"{relpath!r} leaves the work dir")
        return path

    def write_text(self, relpath: str, text: str) -> str:
        path = self._path(relpath)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.redact(text))
        return str(path)

    def write_bytes(self, relpath: str, data: bytes) -> str:
        path = self._path(relpath)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return str(path)

    def read_text(self, relpath: str) -> str:
        return self._path(relpath).read_text(errors="replace")

    def exists(self, relpath: str) -> bool:
        return self._path(relpath).exists()
