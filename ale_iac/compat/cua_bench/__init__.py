"""A ``cua_bench``-compatible module: what ALE's tasks (cua-bench tasks) use of the real package.

    import cua_bench as cb

    @cb.tasks_config(split="train")
    def load() -> list[cb.Task]: ...                                   # one Task per variant

    @cb.setup_task(split="train")
    async def start(task_cfg: cb.Task, session: cb.DesktopSession) -> None: ...

    @cb.evaluate_task(split="train")
    async def evaluate(task_cfg: cb.Task, session: cb.DesktopSession) -> list[float]: ...

The decorators mark a function with its role (:data:`ROLE_ATTR`) and return it unchanged; the runner
finds the three functions by that mark. :class:`DesktopSession` is the session ALE's runner hands the
hooks, over this project's :class:`~ale_iac.sandbox.client.ComputerServerClient`, with the methods and
return shapes the tasks use (``run_command`` gives ``{"return_code", "stdout", "stderr"}``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ale_iac.sandbox.client import ComputerServerClient

__all__ = ["ROLE_ATTR", "DesktopSession", "Task", "evaluate_task", "setup_task", "tasks_config"]

ROLE_ATTR = "__cua_bench_role__"
"""The attribute the decorators set: ``tasks_config``, ``setup_task`` or ``evaluate_task``."""
SPLIT_ATTR = "__cua_bench_split__"

F = TypeVar("F", bound=Callable[..., Any])


def _marker(role: str) -> Callable[..., Any]:
    def decorator_factory(fn: Any = None, *, split: str = "train") -> Any:
        def mark(target: F) -> F:
            setattr(target, ROLE_ATTR, role)
            setattr(target, SPLIT_ATTR, split)
            return target

        # Both ``@cb.setup_task`` and ``@cb.setup_task(split="train")``.
        return mark(fn) if callable(fn) else mark

    decorator_factory.__name__ = role
    return decorator_factory


tasks_config = _marker("tasks_config")
setup_task = _marker("setup_task")
evaluate_task = _marker("evaluate_task")


class Task:
    """One variant of a task: its description (the agent's prompt), metadata and computer."""

    def __init__(
        self,
        description: str = "",
        metadata: dict[str, Any] | None = None,
        computer: dict[str, Any] | None = None,
        **extra: Any,
    ) -> None:
        self.description = description
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.computer: dict[str, Any] = dict(computer or {})
        self.extra = extra

    @property
    def os_type(self) -> str | None:
        setup = self.computer.get("setup_config")
        value = setup.get("os_type") if isinstance(setup, dict) else None
        return str(value) if value is not None else None

    def __repr__(self) -> str:
        return f"Task(description={self.description[:40]!r}, metadata keys={sorted(self.metadata)})"


class CommandFailedError(RuntimeError):
    """``run_command(cmd, check=True)`` for a command that exited non-zero."""


class _Interface:
    """``session.interface``: the computer's lower-level calls the tasks use."""

    def __init__(self, client: ComputerServerClient) -> None:
        self._client = client

    async def create_dir(self, path: str) -> None:
        await self._client.make_dir(path)

    async def delete_dir(self, path: str) -> None:
        await self._client.delete_dir(path)

    async def delete_file(self, path: str) -> None:
        await self._client.delete_file(path)

    async def file_exists(self, path: str) -> bool:
        return await self._client.file_exists(path)

    async def directory_exists(self, path: str) -> bool:
        return await self._client.dir_exists(path)

    async def list_dir(self, path: str) -> list[str]:
        return await self._client.list_dir(path)

    async def read_text(self, path: str) -> str:
        return await self._client.read_text(path)

    async def write_text(self, path: str, content: str) -> None:
        await self._client.write_text(path, content)

    async def read_bytes(self, path: str) -> bytes:
        return await self._client.read_bytes(path)

    async def write_bytes(self, path: str, content: bytes) -> None:
        await self._client.write_bytes(path, content)

    async def run_command(self, command: str) -> dict[str, Any]:
        result = await self._client.run_command(command)
        return {"return_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}

    async def screenshot(self) -> bytes:
        return await self._client.screenshot()


class DesktopSession:
    """The session a cua-bench task's ``start`` and ``evaluate`` receive."""

    def __init__(self, client: ComputerServerClient, os_type: str = "linux") -> None:
        self.client = client
        self.os_type = os_type
        self.interface = _Interface(client)

    async def run_command(self, cmd: str, check: bool = False, timeout: float | None = None) -> dict[str, Any]:
        """Run ``cmd`` with the server's shell: ``{"return_code", "stdout", "stderr"}``; with ``check``,
        a non-zero exit raises :class:`CommandFailedError`."""
        result = await self.client.run_command(cmd, timeout=timeout)
        if check and result.exit_code != 0:
            detail = (result.stderr or result.stdout).strip()[-300:]
            raise CommandFailedError(f"`{cmd[:120]}` exited {result.exit_code}: {detail}")
        return {"return_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}

    async def file_exists(self, path: str) -> bool:
        return await self.client.file_exists(path)

    async def directory_exists(self, path: str) -> bool:
        return await self.client.dir_exists(path)

    async def list_dir(self, path: str) -> list[str]:
        return await self.client.list_dir(path)

    async def read_file(self, path: str) -> str:
        return await self.client.read_text(path)

    async def write_file(self, path: str, content: str) -> None:
        await self.client.write_text(path, content)

    async def read_text(self, path: str) -> str:
        return await self.client.read_text(path)

    async def write_text(self, path: str, content: str) -> None:
        await self.client.write_text(path, content)

    async def read_bytes(self, path: str) -> bytes:
        return await self.client.read_bytes(path)

    async def write_bytes(self, path: str, content: bytes) -> None:
        await self.client.write_bytes(path, content)

    async def screenshot(self) -> bytes:
        return await self.client.screenshot()
