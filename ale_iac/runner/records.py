"""Run records: one folder per unit, written as things happen, with secrets redacted everywhere.

<run dir>/<unit id>/
  run.json           config (secrets redacted), phase timings, status, score, stack, cleanup outcome;
                     for a ``local`` sandbox its ``limits`` and ``oom_kills`` (``runner/unit_limits.py``)
  events.jsonl       one JSON object per event, appended and flushed immediately
  trajectory.json    the agent's ATIF-compatible trajectory (+ screenshots/ next to it)
  eval_result.json   score and evaluation details (``details``: what ``evaluate`` returned beside the score)
  hooks.log          what the task's hooks printed or logged, and their tracebacks
  agent/             the agent's work dir: raw logs, screenshots
  output/            the task's output dir pulled back from the sandbox
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ale_iac.clock import utc_now
from ale_iac.files import write_json_atomic

MANIFEST = "experiment.json"
"""The run folder's manifest (run id, fingerprint, spec, where it runs: profile or pool, each agent's executor and
model), written by the runner, read by resume and reports."""
REDACTED = "***"
_MIN_SECRET_LEN = 4


class Redactor:
    """Replaces every known secret value in text. Values shorter than 4 chars are refused up front."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._values: list[str] = []
        for value in secrets:
            self.add(value)

    def add(self, value: str) -> None:
        if len(value) < _MIN_SECRET_LEN:
            raise ValueError("a secret shorter than 4 characters cannot be redacted reliably")
        if value not in self._values:
            self._values.append(value)
            self._values.sort(key=len, reverse=True)  # longest first: a secret may contain another

    def __call__(self, text: str) -> str:
        for value in self._values:
            text = text.replace(value, REDACTED)
        return text

    def json(self, data: Any) -> Any:
        """A deep copy of ``data`` with every string redacted."""
        if isinstance(data, str):
            return self(data)
        if isinstance(data, dict):
            return {self(str(k)): self.json(v) for k, v in data.items()}
        if isinstance(data, list | tuple):
            return [self.json(v) for v in data]
        return data

    def scrub_tree(self, root: Path) -> int:
        """Redact secrets in every text file under ``root`` (agent logs, pulled outputs)."""
        changed = 0
        if not self._values:
            return 0
        for path in root.rglob("*"):
            if not path.is_file():
                continue
            data = path.read_bytes()
            if not any(v.encode() in data for v in self._values):
                continue
            clean = data
            for value in self._values:
                clean = clean.replace(value.encode(), REDACTED.encode())
            path.write_bytes(clean)
            changed += 1
        return changed


class UnitRecord:
    """Writes one unit's folder. Thread-safe for events; every write goes through the redactor."""

    def __init__(self, folder: Path, redactor: Redactor) -> None:
        self.folder = folder
        self.redact = redactor
        folder.mkdir(parents=True, exist_ok=True)
        self._events = (folder / "events.jsonl").open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._phase_start: dict[str, float] = {}
        self.phases: dict[str, dict[str, Any]] = {}
        self.data: dict[str, Any] = {}
        self.event_counts: Counter[str] = Counter()
        """How many events of each kind this record has written (this attempt's)."""

    @property
    def agent_dir(self) -> Path:
        return self.folder / "agent"

    @property
    def output_dir(self) -> Path:
        return self.folder / "output"

    def previous_run(self) -> dict[str, Any]:
        """The ``run.json`` an earlier attempt of this unit left (``--resume``), or {}."""
        try:
            data = json.loads((self.folder / "run.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def append_text(self, name: str, text: str) -> None:
        """Append ``text`` (redacted) to a text file of the record."""
        with self._lock, (self.folder / name).open("a", encoding="utf-8") as handle:
            handle.write(self.redact(text))

    def event(self, kind: str, **fields: Any) -> None:
        line = json.dumps(self.redact.json({"t": utc_now(), "event": kind, **fields}), default=str)
        with self._lock:
            self._events.write(line + "\n")
            self._events.flush()
            self.event_counts[kind] += 1

    def phase_start(self, phase: str) -> None:
        self._phase_start[phase] = time.monotonic()
        self.phases[phase] = {"started_at": utc_now()}
        self.event("phase_start", phase=phase)

    def phase_end(self, phase: str, ok: bool = True, **fields: Any) -> float:
        seconds = time.monotonic() - self._phase_start.get(phase, time.monotonic())
        self.phases.setdefault(phase, {}).update({"seconds": round(seconds, 3), "ok": ok, **fields})
        self.event("phase_end", phase=phase, ok=ok, seconds=round(seconds, 3), **fields)
        return seconds

    def write_json(self, name: str, data: Any) -> Path:
        path = self.folder / name
        write_json_atomic(path, self.redact.json(data), mode=0o644)
        return path

    def write_run(self, **fields: Any) -> None:
        self.data.update(fields)
        self.write_json("run.json", {**self.data, "phases": self.phases})

    def close(self) -> None:
        with self._lock:
            self._events.close()
