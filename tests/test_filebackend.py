"""The file backend's files torn as a SIGKILL of the CLI tears them, read and repaired without the CLI.

Every backend here is made by the real CLI (marker stacks, no sandbox); the tearing copies what fileblob
leaves when a write is killed between its steps (temp file, sidecar, rename; see ``ale_iac.filebackend``).
The tests that start from one stack updated twice tear a copy of one backend the CLI wrote once for the
module (``two_versions``): its files, byte for byte, in the test's own home.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
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


STACK = "fb"


def _two_versions(engine: Engine, tmp_path: Path, stack: str) -> Path:
    """A stack written by two updates: the second one's content (``two``) is the checkpoint."""
    engine.up(stack, marker_program(str(tmp_path / f"{stack}.txt"), "one"))
    engine.up(stack, marker_program(str(tmp_path / f"{stack}.txt"), "two"))
    return _checkpoint(engine, stack)


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An ale-iac home whose backend holds stack ``fb``, written by two updates of the real CLI (``two`` is
    the checkpoint). Made once for the module; tests tear copies of it (:func:`_copy_of`)."""
    home = tmp_path_factory.mktemp("fb-two-versions")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("ALE_IAC_HOME", str(home))
        env.delenv("PULUMI_BACKEND_URL", raising=False)
        env.delenv("PULUMI_CONFIG_PASSPHRASE", raising=False)
        with Engine() as engine:
            _two_versions(engine, home, STACK)
    yield home


def _copy_of(template: Path) -> tuple[Engine, Path]:
    """The template's backend and passphrase copied into this test's home: an engine on it, and the
    checkpoint of ``fb``."""
    engine = Engine()
    assert engine.state_root is not None and not any(engine.state_root.iterdir())
    shutil.copytree(template / "state", engine.state_root, symlinks=True, dirs_exist_ok=True)
    shutil.copy2(template / "passphrase", engine.passphrase_file)
    return engine, _checkpoint(engine, STACK)


def _repair(engine: Engine) -> list[filebackend.Damage]:
    found = engine.scan_state()
    assert found is not None
    done, errors = filebackend.repair(found, filebackend.quarantine_folder(engine.home))
    assert errors == []
    return done


def test_a_write_killed_while_it_committed_is_finished(tmp_path: Path, two_versions: Path) -> None:
    """Killed after the sidecar was truncated, before the rename: an empty ``.attrs``, the old checkpoint, and
    the complete new one in a temp file. Every CLI read fails (``error: EOF``) until the write is finished."""
    engine, checkpoint = _copy_of(two_versions)
    engine.up("fb-intact", marker_program(str(tmp_path / "intact.txt"), "x"))
    _temp_name(checkpoint).write_bytes(checkpoint.read_bytes())
    checkpoint.write_bytes(Path(f"{checkpoint}.bak").read_bytes())
    Path(f"{checkpoint}.attrs").write_bytes(b"")
    with pytest.raises(StackOperationError, match="EOF"):
        engine.outputs(STACK)

    assert [s.name for s in engine.list_stacks()] == ["fb-intact"]  # the CLI's listing fails: the readable ones
    done = _repair(engine)
    assert [(d.path.name, d.stack) for d in done] == [("fb.json.attrs", STACK)]
    assert "empty sidecar of fb.json" in done[0].problem and "finish that write" in done[0].remedy
    assert engine.outputs(STACK)["secret"] == "s3cr3t-two"  # the newer version, committed
    assert sorted(s.name for s in engine.list_stacks()) == [STACK, "fb-intact"]
    assert list(checkpoint.parent.glob("*.tmp")) == []
    found = engine.scan_state()
    assert found is not None and found.damage == []


def test_a_truncated_checkpoint_is_restored_from_the_newest_earlier_version(two_versions: Path) -> None:
    engine, checkpoint = _copy_of(two_versions)
    whole = checkpoint.read_bytes()
    checkpoint.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(StackOperationError, match="unexpected end of JSON input"):
        engine.outputs(STACK)

    found = engine.scan_state()
    assert found is not None and found.repairable == [STACK] and found.readable == []
    done = _repair(engine)
    assert [d.path for d in done] == [checkpoint]
    assert "unreadable checkpoint JSON" in done[0].problem and "backups/" in done[0].remedy
    # backups/ keeps each update's end, newer than the .bak (the write before the last): the second update.
    assert engine.outputs(STACK)["secret"] == "s3cr3t-two"
    kept = list((engine.home / "quarantine").glob(f"*/stacks/{PROJECT}/fb.json"))
    assert [p.read_bytes() for p in kept] == [whole[: len(whole) // 2]]
    engine.destroy(STACK)


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


def test_a_stack_with_no_readable_version_goes_to_the_quarantine(two_versions: Path) -> None:
    engine, checkpoint = _copy_of(two_versions)
    assert engine.state_root is not None
    meta = engine.state_root / ".pulumi"
    for folder in (meta / "backups" / PROJECT / STACK, meta / "history" / PROJECT / STACK):
        for path in folder.glob("*.json"):
            path.write_bytes(b"")
    Path(f"{checkpoint}.bak").write_bytes(b'{"version": 3, "checkp')
    checkpoint.write_bytes(b"")

    found = engine.scan_state()
    assert found is not None and found.lost == [STACK] and found.repairable == []
    done = _repair(engine)
    assert [d.path for d in done] == [checkpoint] and done[0].problem.startswith("empty checkpoint")
    assert engine.list_stacks() == []
    quarantined = sorted(p.name for p in (engine.home / "quarantine").glob(f"*/stacks/{PROJECT}/*"))
    assert quarantined == ["fb.json", "fb.json.attrs", "fb.json.bak", "fb.json.bak.attrs"]


def test_leftover_temp_files_and_torn_sidecars_of_other_files_are_mended(two_versions: Path) -> None:
    """A write killed before its commit leaves a temp file (the checkpoint stays the old one); an empty
    sidecar of ``meta.yaml`` fails every command, one of a history file ``pulumi stack history``."""
    engine, checkpoint = _copy_of(two_versions)
    assert engine.state_root is not None
    meta = engine.state_root / ".pulumi"
    partial = _temp_name(checkpoint)
    partial.write_bytes(checkpoint.read_bytes()[:100])
    history = sorted((meta / "history" / PROJECT / STACK).glob("*.history.json"))[-1]
    for path in (meta / "meta.yaml", history, Path(f"{checkpoint}.bak")):
        Path(f"{path}.attrs").write_bytes(b"")
    with pytest.raises(StackOperationError, match=r"meta\.yaml.*EOF"):
        engine.outputs(STACK)

    done = _repair(engine)
    assert sorted(d.path.name for d in done) == sorted(
        [partial.name, "meta.yaml.attrs", f"{history.name}.attrs", "fb.json.bak.attrs"]
    )
    assert engine.outputs(STACK)["secret"] == "s3cr3t-two"
    assert [e["result"] for e in _history(engine, STACK)] == ["succeeded", "succeeded"]
    assert not partial.exists() and list((engine.home / "quarantine").glob(f"*/stacks/{PROJECT}/{partial.name}"))
    engine.destroy(STACK)


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


def test_the_files_of_a_stack_a_live_process_is_writing_are_left_alone(two_versions: Path) -> None:
    """Mid-write, every file looks torn for a moment: a stack whose lock a live process holds is not touched."""
    engine, checkpoint = _copy_of(two_versions)
    assert engine.state_root is not None
    lock = engine.state_root / ".pulumi" / "locks" / "organization" / PROJECT / STACK / "held.json"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(json.dumps({"pid": os.getpid(), "username": "t", "hostname": "h", "timestamp": "x"}))
    _temp_name(checkpoint).write_bytes(checkpoint.read_bytes()[:10])
    Path(f"{checkpoint}.attrs").write_bytes(b"")

    found = engine.scan_state()
    assert found is not None and found.damage == [] and found.readable == []
    lock.unlink()
    found = engine.scan_state()
    assert found is not None and {d.stack for d in found.damage} == {STACK} and len(found.damage) == 2


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
