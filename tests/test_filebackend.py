"""The file backend's files torn as a SIGKILL of the CLI tears them, read and repaired without the CLI.

Every backend here is made by the real CLI (marker stacks, no sandbox); the tearing copies what fileblob
leaves when a write is killed between its steps (temp file, sidecar, rename; see ``ale_iac.filebackend``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ale_iac import filebackend
from ale_iac.engine import PROJECT, Engine, StackOperationError
from ale_iac.provision import destroy_stack
from tests.support.engine import marker_program

pytestmark = [pytest.mark.engine]


def _checkpoint(engine: Engine, stack: str) -> Path:
    assert engine.state_root is not None
    return engine.state_root / ".pulumi" / "stacks" / PROJECT / f"{stack}.json"


def _temp_name(path: Path) -> Path:
    """A temp file name as fileblob makes it: the final name, hex nanoseconds, ``.tmp``."""
    return path.with_name(f"{path.name}.{time.time_ns():x}.tmp")


def _two_versions(engine: Engine, tmp_path: Path, stack: str) -> Path:
    """A stack written by two updates: the second one's content (``two``) is the checkpoint."""
    engine.up(stack, marker_program(str(tmp_path / f"{stack}.txt"), "one"))
    engine.up(stack, marker_program(str(tmp_path / f"{stack}.txt"), "two"))
    return _checkpoint(engine, stack)


def _repair(engine: Engine) -> list[filebackend.Damage]:
    found = engine.scan_state()
    assert found is not None
    done, errors = filebackend.repair(found, filebackend.quarantine_folder(engine.home))
    assert errors == []
    return done


def test_a_write_killed_while_it_committed_is_finished(tmp_path: Path) -> None:
    """Killed after the sidecar was truncated, before the rename: an empty ``.attrs``, the old checkpoint, and
    the complete new one in a temp file. Every CLI read fails (``error: EOF``) until the write is finished."""
    engine = Engine()
    checkpoint = _two_versions(engine, tmp_path, "fb-torn")
    engine.up("fb-intact", marker_program(str(tmp_path / "intact.txt"), "x"))
    _temp_name(checkpoint).write_bytes(checkpoint.read_bytes())
    checkpoint.write_bytes(Path(f"{checkpoint}.bak").read_bytes())
    Path(f"{checkpoint}.attrs").write_bytes(b"")
    with pytest.raises(StackOperationError, match="EOF"):
        engine.outputs("fb-torn")

    assert [s.name for s in engine.list_stacks()] == ["fb-intact"]  # the CLI's listing fails: the readable ones
    done = _repair(engine)
    assert [(d.path.name, d.stack) for d in done] == [("fb-torn.json.attrs", "fb-torn")]
    assert "empty sidecar of fb-torn.json" in done[0].problem and "finish that write" in done[0].remedy
    assert engine.outputs("fb-torn")["secret"] == "s3cr3t-two"  # the newer version, committed
    assert sorted(s.name for s in engine.list_stacks()) == ["fb-intact", "fb-torn"]
    assert list(checkpoint.parent.glob("*.tmp")) == []
    found = engine.scan_state()
    assert found is not None and found.damage == []


def test_a_truncated_checkpoint_is_restored_from_the_newest_earlier_version(tmp_path: Path) -> None:
    engine = Engine()
    checkpoint = _two_versions(engine, tmp_path, "fb-cut")
    whole = checkpoint.read_bytes()
    checkpoint.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(StackOperationError, match="unexpected end of JSON input"):
        engine.outputs("fb-cut")

    found = engine.scan_state()
    assert found is not None and found.repairable == ["fb-cut"] and found.readable == []
    done = _repair(engine)
    assert [d.path for d in done] == [checkpoint]
    assert "unreadable checkpoint JSON" in done[0].problem and "backups/" in done[0].remedy
    # backups/ keeps each update's end, newer than the .bak (the write before the last): the second update.
    assert engine.outputs("fb-cut")["secret"] == "s3cr3t-two"
    kept = list((engine.home / "quarantine").glob(f"*/stacks/{PROJECT}/fb-cut.json"))
    assert [p.read_bytes() for p in kept] == [whole[: len(whole) // 2]]
    engine.destroy("fb-cut")


def test_a_gzip_checkpoint_cut_short_is_restored_from_a_gzip_backup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PULUMI_DIY_BACKEND_GZIP", "true")  # the CLI writes <stack>.json.gz
    engine = Engine()
    _two_versions(engine, tmp_path, "fb-gz")
    checkpoint = _checkpoint(engine, "fb-gz").with_name("fb-gz.json.gz")
    whole = checkpoint.read_bytes()
    checkpoint.write_bytes(whole[: len(whole) - 20])
    with pytest.raises(StackOperationError):
        engine.outputs("fb-gz")

    done = _repair(engine)
    assert [d.path for d in done] == [checkpoint] and "unreadable gzip checkpoint" in done[0].problem
    assert ".json.gz" in done[0].remedy
    assert engine.outputs("fb-gz")["secret"] == "s3cr3t-two"
    engine.destroy("fb-gz")


def test_a_stack_with_no_readable_version_goes_to_the_quarantine(tmp_path: Path) -> None:
    engine = Engine()
    checkpoint = _two_versions(engine, tmp_path, "fb-gone")
    assert engine.state_root is not None
    meta = engine.state_root / ".pulumi"
    for folder in (meta / "backups" / PROJECT / "fb-gone", meta / "history" / PROJECT / "fb-gone"):
        for path in folder.glob("*.json"):
            path.write_bytes(b"")
    Path(f"{checkpoint}.bak").write_bytes(b'{"version": 3, "checkp')
    checkpoint.write_bytes(b"")

    found = engine.scan_state()
    assert found is not None and found.lost == ["fb-gone"] and found.repairable == []
    done = _repair(engine)
    assert [d.path for d in done] == [checkpoint] and done[0].problem.startswith("empty checkpoint")
    assert engine.list_stacks() == []
    quarantined = sorted(p.name for p in (engine.home / "quarantine").glob(f"*/stacks/{PROJECT}/*"))
    assert quarantined == ["fb-gone.json", "fb-gone.json.attrs", "fb-gone.json.bak", "fb-gone.json.bak.attrs"]


def test_leftover_temp_files_and_torn_sidecars_of_other_files_are_mended(tmp_path: Path) -> None:
    """A write killed before its commit leaves a temp file (the checkpoint stays the old one); an empty
    sidecar of ``meta.yaml`` fails every command, one of a history file ``pulumi stack history``."""
    engine = Engine()
    checkpoint = _two_versions(engine, tmp_path, "fb-s")
    assert engine.state_root is not None
    meta = engine.state_root / ".pulumi"
    partial = _temp_name(checkpoint)
    partial.write_bytes(checkpoint.read_bytes()[:100])
    history = sorted((meta / "history" / PROJECT / "fb-s").glob("*.history.json"))[-1]
    for path in (meta / "meta.yaml", history, Path(f"{checkpoint}.bak")):
        Path(f"{path}.attrs").write_bytes(b"")
    with pytest.raises(StackOperationError, match=r"meta\.yaml.*EOF"):
        engine.outputs("fb-s")

    done = _repair(engine)
    assert sorted(d.path.name for d in done) == sorted(
        [partial.name, "meta.yaml.attrs", f"{history.name}.attrs", "fb-s.json.bak.attrs"]
    )
    assert engine.outputs("fb-s")["secret"] == "s3cr3t-two"
    assert [e["result"] for e in _history(engine, "fb-s")] == ["succeeded", "succeeded"]
    assert not partial.exists() and list((engine.home / "quarantine").glob(f"*/stacks/{PROJECT}/{partial.name}"))
    engine.destroy("fb-s")


def _history(engine: Engine, stack: str) -> list[dict[str, object]]:
    """``pulumi stack history --json``: it reads every history file of the stack (and their sidecars)."""
    import subprocess

    result = subprocess.run(
        [
            str(engine.toolchain.bin_dir / "pulumi"),
            "stack",
            "history",
            "--json",
            "-s",
            f"organization/{PROJECT}/{stack}",
        ],
        env={**os.environ, **engine.env_vars()},
        capture_output=True,
        text=True,
        check=True,
        cwd=engine.home,
    )
    entries: list[dict[str, object]] = json.loads(result.stdout)
    return entries


def test_the_files_of_a_stack_a_live_process_is_writing_are_left_alone(tmp_path: Path) -> None:
    """Mid-write, every file looks torn for a moment: a stack whose lock a live process holds is not touched."""
    engine = Engine()
    checkpoint = _two_versions(engine, tmp_path, "fb-busy")
    assert engine.state_root is not None
    lock = engine.state_root / ".pulumi" / "locks" / "organization" / PROJECT / "fb-busy" / "held.json"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"pid": os.getpid(), "username": "t", "hostname": "h", "timestamp": "x"}))
    _temp_name(checkpoint).write_bytes(checkpoint.read_bytes()[:10])
    Path(f"{checkpoint}.attrs").write_bytes(b"")

    found = engine.scan_state()
    assert found is not None and found.damage == [] and found.readable == []
    lock.unlink()
    found = engine.scan_state()
    assert found is not None and {d.stack for d in found.damage} == {"fb-busy"} and len(found.damage) == 2


def test_a_temp_file_in_a_lock_folder_is_a_lock_that_recovery_releases(tmp_path: Path) -> None:
    """The CLI counts every file of a stack's lock folder as a lock, a killed CLI's temp file too."""
    engine = Engine()
    engine.up("fb-locked", marker_program(str(tmp_path / "m.txt"), "x"))
    assert engine.state_root is not None
    folder = engine.state_root / ".pulumi" / "locks" / "organization" / PROJECT / "fb-locked"
    folder.mkdir(parents=True, exist_ok=True)
    _temp_name(folder / "0a1b2c3d.json").write_text('{"pid": 4')
    assert engine.lock_holders("fb-locked") == [0]
    assert destroy_stack(engine, "fb-locked")
    assert engine.list_stacks() == [] and not (tmp_path / "m.txt").exists()
