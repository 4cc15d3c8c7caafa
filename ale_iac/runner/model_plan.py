"""A run that follows a model plan (``ale-iac evaluate --model-plan PLAN``): no vendor, no API key.

The run starts the scripted model server (``ale-iac model-server``, ``docs/models.md``) in a process of its
own on 127.0.0.1, with a throwaway key made here, and points the upstream of every model grant of its
gateway there: the agents run unchanged (their presets' own model config, the gateway, a per-unit token),
only the vendor is the plan. A preset's ``model.scripted_name`` is the model name sent instead of its
``name`` (Codex offers its MCP tools only to a model it does not know). The server's log goes to the run
folder (``model_server.log``). It is stopped by closing its standard input (and killed by its pid if it
lingers): at the end of the run, on an interrupt, and, since the pipe closes with the run's process,
also when the run dies.

When the plan cannot be followed, the server answers an HTTP 400 whose message starts with
``plan error: ``; the gateway keeps that message in the unit's calls (``model_usage.json``), and
:func:`plan_error_in` reads it back, so the unit ends an agent failure with the plan error as its reason.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import select
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ale_iac.errors import AleIacError
from ale_iac.llm.gateway import ApiKind, base_url_for
from ale_iac.llm.scripted_replies import PLAN_ERROR
from ale_iac.procs import stop_by_closing_stdin

LOG_NAME: Final = "model_server.log"
KEY_ENV: Final = "ALE_IAC_MODEL_PLAN_KEY"
"""The variable the server process reads its throwaway key from (set in its environment only)."""
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 10.0
_BANNER = re.compile(r"scripted model server on (http://127\.0\.0\.1:\d+) ")


@dataclass(frozen=True)
class ModelUpstream:
    """Where every model grant of the run goes instead of its preset's upstream, with the key to send."""

    root: str
    """The server's root, ``http://127.0.0.1:PORT`` (each API's base URL follows the vendors' convention)."""
    api_key: str = field(repr=False)

    def base_url(self, api: ApiKind) -> str:
        return base_url_for(api, self.root)


def plan_record(path: Path) -> dict[str, Any]:
    """What a run records of the plan it followed: its file and the hash of its content."""
    return {"file": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def plan_error_in(usage: dict[str, Any]) -> str | None:
    """The first plan error the upstream answered a unit's calls with (``plan error: ...``), if any."""
    for call in usage.get("calls") or []:
        message = call.get("upstream_error") if isinstance(call, dict) else None
        if isinstance(message, str) and message.startswith(PLAN_ERROR):
            return message
    return None


class PlanServer:
    """The scripted model server process of a run: :meth:`start`, read :attr:`upstream`, :meth:`close`."""

    def __init__(self, plan: Path, log: Path) -> None:
        self.plan = plan
        self.log = log
        self._key = secrets.token_urlsafe(32)
        self._proc: subprocess.Popen[bytes] | None = None
        self._root: str | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def upstream(self) -> ModelUpstream:
        if self._root is None:
            raise RuntimeError("the scripted model server is not started")
        return ModelUpstream(self._root, self._key)

    def start(self) -> None:
        """Start it and return once it listens (its first line names its address)."""
        argv = [sys.executable, "-m", "ale_iac", "model-server", "--plan", str(self.plan), "--port", "0"]
        argv += ["--api-key-env", KEY_ENV, "--until-stdin-closes"]
        with self.log.open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, KEY_ENV: self._key},
                close_fds=True,
            )
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], START_TIMEOUT_S)
        line = self._proc.stdout.readline().decode(errors="replace") if ready else ""
        found = _BANNER.search(line)
        if found is None:
            self.close()
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise AleIacError(f"the scripted model server did not start ({' | '.join(tail) or line!r}); see {self.log}")
        self._root = found[1]

    def close(self) -> None:
        """Stop it: close its standard input, wait, kill it by its pid if it lingers. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_by_closing_stdin(proc, timeout=STOP_TIMEOUT_S)

    @property
    def key(self) -> str:
        """The throwaway key (for the run's redactor)."""
        return self._key
