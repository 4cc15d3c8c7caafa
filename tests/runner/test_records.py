"""Run records and secret redaction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ale_iac.runner.records import REDACTED, Redactor, UnitRecord


def test_redactor_replaces_every_secret_longest_first() -> None:
    redact = Redactor(["sk-abcdef", "sk-abcdef-long"])
    assert redact("key sk-abcdef-long and sk-abcdef") == f"key {REDACTED} and {REDACTED}"
    assert redact.json({"a": ["sk-abcdef"], "sk-abcdef": 1}) == {"a": [REDACTED], REDACTED: 1}


def test_redactor_refuses_short_secrets() -> None:
    with pytest.raises(ValueError, match="shorter than 4"):
        Redactor(["abc"])


def test_unit_record_writes_events_as_they_happen_and_redacts(tmp_path: Path) -> None:
    record = UnitRecord(tmp_path / "u", Redactor(["hunter2-secret"]))
    record.phase_start("agent")
    # Flushed immediately: readable before the record is closed.
    lines = (tmp_path / "u" / "events.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "phase_start"
    record.phase_end("agent", error="token hunter2-secret rejected")
    record.write_run(status="succeeded", config={"key": "hunter2-secret"})
    (record.agent_dir).mkdir()
    (record.agent_dir / "raw.log").write_text("sent hunter2-secret\n")
    assert record.redact.scrub_tree(record.folder) == 1
    record.close()
    text = "".join(p.read_text() for p in (tmp_path / "u").rglob("*") if p.is_file())
    assert "hunter2-secret" not in text
    run = json.loads((tmp_path / "u" / "run.json").read_text())
    assert run["phases"]["agent"]["ok"] is True and run["config"]["key"] == REDACTED
