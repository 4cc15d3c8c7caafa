"""The Pulumi file backend's own files, read by ale-iac itself: writes torn by a kill found, repaired or put aside.

The CLI writes every file of a ``file://`` backend (``gocloud.dev``'s fileblob) in three steps: the data
to a temp file beside it (``<name>.<hex nanoseconds>.tmp``), then a sidecar ``<name>.attrs`` (JSON: content
type, MD5) truncated and rewritten in place, then the temp file renamed over ``<name>``. A SIGKILL between
them leaves a temp file behind, or an empty sidecar, and every later read of ``<name>`` fails on it
(``error: EOF``): one such sidecar under ``stacks/`` fails ``pulumi stack ls`` for every stack, the one of
``meta.yaml`` every command. A missing sidecar is fine (the CLI takes defaults).

The engine keeps earlier versions of each stack's checkpoint: ``<stack>.json.bak`` (the one before the last
write), ``backups/<project>/<stack>/<stack>.<ns>.json`` and ``history/<project>/<stack>/<stack>-<ns>
.checkpoint.json`` (after each update). :func:`scan` reads the files itself (never through the CLI) and
says, per damaged file, what :func:`repair` does: finish a write that was killed while it committed, write
the sidecar anew, restore the newest readable earlier version, or move what cannot be read to a quarantine
folder. Files of a stack that a live ``pulumi`` process may be writing right now are left alone.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import gzip
import hashlib
import json
import os
import re
import secrets
import shutil
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from ale_iac import procs

_TMP_RE = re.compile(r"^(?P<name>.+)\.(?P<ns>[0-9a-f]+)\.tmp$")
"""fileblob's temp files: the final name, the hex nanoseconds of their creation, ``.tmp``."""
_CHECKPOINT_RE = re.compile(r"^(?P<stack>.+)\.json(?P<compression>\.gz|\.zst)?$")
_STACK_FILE_RE = re.compile(r"^(?P<stack>.+)\.json(?:\.gz|\.zst)?(?:\.bak)?(?:\.attrs|\.[0-9a-f]+\.tmp)?$")
_NS_RE = re.compile(r"[.-](\d+)(?:\.checkpoint)?\.json(?:\.gz|\.zst)?$")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ATTRS = ".attrs"

Writing = Callable[[str | None], bool]
"""Whether a live process may be writing the files of this stack (None: the backend's own files) now."""


@dataclass(frozen=True)
class Damage:
    """One damaged file of the backend and what :func:`repair` does about it."""

    path: Path
    problem: str
    remedy: str
    stack: str | None
    """The stack the file belongs to; None for the backend's own files (``meta.yaml``)."""
    lost: bool = False
    """The stack has no readable version left: its files go to the quarantine and the stack is gone."""
    fix: Callable[[Path], None] = field(repr=False, compare=False, default=lambda _q: None)
    """Does the remedy, given the quarantine folder of this repair."""

    def describe(self) -> str:
        return f"{self.path}: {self.problem}; {self.remedy}"


@dataclass
class Scan:
    """What :func:`scan` found in one backend folder."""

    root: Path
    damage: list[Damage] = field(default_factory=list)
    readable: list[str] = field(default_factory=list)
    """Stacks whose checkpoint and sidecar read as they are (what ``pulumi stack ls`` would list)."""

    @property
    def repairable(self) -> list[str]:
        """Damaged stacks that a repair leaves readable."""
        damaged = {d.stack for d in self.damage if d.stack is not None and not d.lost}
        return sorted(s for s in damaged if s not in self.readable and s not in self.lost)

    @property
    def lost(self) -> list[str]:
        return sorted({d.stack for d in self.damage if d.stack is not None and d.lost})


def scan(root: Path, project: str, writing: Writing) -> Scan:
    """Every damaged file of project ``project`` in the backend folder ``root`` (the one holding ``.pulumi``)."""
    meta = root / ".pulumi"
    found = Scan(root=root)
    handled: set[Path] = set()
    for checkpoint in sorted(_files(meta / "stacks" / project)):
        match = _CHECKPOINT_RE.match(checkpoint.name)
        if match is None or writing(match["stack"]):
            continue
        damage, readable = _check_checkpoint(meta, project, match["stack"], checkpoint, handled)
        found.damage += damage
        if readable:
            found.readable.append(match["stack"])
    for path in _backend_files(meta, project):
        stack = _stack_of(meta, path)
        if path not in handled and not writing(stack):
            found.damage += _check_plain_file(meta, path, stack)
    return found


def repair(found: Scan, quarantine: Path) -> tuple[list[Damage], list[str]]:
    """Do every remedy of ``found``; what was damaged in the backend is copied or moved under ``quarantine``.

    Returns the damage repaired and the errors (``path: reason``) of remedies that failed.
    """
    done: list[Damage] = []
    errors: list[str] = []
    for damage in found.damage:
        try:
            damage.fix(quarantine)
        except OSError as exc:
            errors.append(f"{damage.path}: {exc}")
            continue
        done.append(damage)
    return done, errors


def quarantine_folder(home: Path) -> Path:
    """A new folder under ``<home>/quarantine`` for one repair (UTC time, pid, random): repairs never mix."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return home / "quarantine" / f"{stamp}-p{os.getpid()}-{secrets.token_hex(2)}"


# --- what a live process may be writing -----------------------------------------------------------


def live_writers(backend_url: str) -> list[tuple[list[str], bool]]:
    """Every live ``pulumi`` CLI that may write the backend ``backend_url``: its argv, and whether it surely
    does (its environment names this backend). One whose environment names no backend, or cannot be read
    (another user's), may still use it (through ``pulumi login`` or its project's ``Pulumi.yaml``)."""
    writers: list[tuple[list[str], bool]] = []
    for pid in procs.all_pids():
        argv = procs.argv(pid)
        if not argv or os.path.basename(argv[0]) != "pulumi":
            continue
        try:
            url = psutil.Process(pid).environ().get("PULUMI_BACKEND_URL")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            url = None
        if url is None or url.rstrip("/") == backend_url.rstrip("/"):
            writers.append((argv, url is not None))
    return writers


def writing_check(backend_url: str, lock_holders: Callable[[str], list[int]]) -> Writing:
    """A :data:`Writing` for ``backend_url``: a stack is being written while a live CLI that may use this
    backend names it in its arguments, or a live process holds its lock; the backend's own files
    (``meta.yaml``, written when a CLI first meets the backend) while a CLI surely uses it."""
    writers = live_writers(backend_url)

    @functools.cache
    def writing(stack: str | None) -> bool:
        if stack is None:
            return any(sure for _, sure in writers)
        named = any(stack in argv or any(a.endswith(f"={stack}") for a in argv) for argv, _ in writers)
        return named or any(procs.alive(pid) for pid in lock_holders(stack))

    return writing


# --- checkpoints ----------------------------------------------------------------------------------


def _check_checkpoint(
    meta: Path, project: str, stack: str, checkpoint: Path, handled: set[Path]
) -> tuple[list[Damage], bool]:
    """The damage of one stack's checkpoint, its sidecar and its temp files; whether it reads as it is."""
    attrs = _sidecar(checkpoint)
    sidecar = _read_attrs(attrs)
    compression = _compression(checkpoint)
    content, problem = _read_checkpoint(checkpoint, compression)
    temps = _temps_of(checkpoint)
    handled.update({checkpoint, attrs, *temps})
    committing = next((t for t in temps if _was_committing(t, compression, sidecar)), None)
    damage: list[Damage] = []
    if committing is not None:
        data = committing.read_bytes()
        torn = attrs if sidecar is None else checkpoint
        why = (
            f"{'empty' if _is_empty(attrs) else 'unreadable'} sidecar of {checkpoint.name} (every read of the "
            "stack fails on it: error: EOF)"
            if sidecar is None
            else f"{checkpoint.name} is older than the write its sidecar describes"
        )
        damage.append(
            Damage(
                torn,
                f"{why}: the CLI was killed while it committed {committing.name}",
                f"finish that write: the complete new version {committing.name} replaces {checkpoint.name} "
                f"(the previous version stays in {checkpoint.name}.bak)",
                stack,
                fix=lambda q: _install(checkpoint, data, meta, q, committing),
            )
        )
    elif content is not None:
        if sidecar is None:
            damage.append(_rewrite_sidecar(attrs, checkpoint, stack))
    else:
        damage.append(_restore_or_lose(meta, project, stack, checkpoint, problem or "unreadable", handled))
    for temp in temps:
        if temp is not committing:
            damage.append(_leftover(temp, meta, stack))
    return damage, content is not None and sidecar is not None


def _restore_or_lose(
    meta: Path, project: str, stack: str, checkpoint: Path, problem: str, handled: set[Path]
) -> Damage:
    """Restore a damaged checkpoint from the newest readable earlier version, or quarantine the stack."""
    compression = _compression(checkpoint)
    for source in _earlier_versions(meta, project, stack, checkpoint):
        data, _ = _read_checkpoint(source, compression)
        if data is None:
            continue
        return Damage(
            checkpoint,
            problem,
            f"restore the newest readable earlier version, {source.relative_to(meta)}; the damaged file "
            "goes to the quarantine",
            stack,
            fix=functools.partial(_install, checkpoint, data, meta, temp=None),
        )
    bak = Path(f"{checkpoint}.bak")
    related = [checkpoint, _sidecar(checkpoint), bak, _sidecar(bak), *_temps_of(bak)]
    related += sorted((meta / "locks").glob(f"*/{project}/{stack}/*"))
    handled.update(related)

    def lose(q: Path) -> None:
        for path in related:
            _move_aside(path, meta, q)

    return Damage(
        checkpoint,
        f"{problem}, and no earlier version reads (.bak, backups, history)",
        "move it to the quarantine with its sidecar, .bak and lock: the stack is gone, and gc stops its "
        "sandboxes since no stack lists them",
        stack,
        lost=True,
        fix=lose,
    )


def _earlier_versions(meta: Path, project: str, stack: str, checkpoint: Path) -> list[Path]:
    """The stack's earlier checkpoints in its own format, newest first: ``.bak`` (copied just before the last
    write) and the ones ``backups/`` and ``history/`` keep of each update's end (their names hold the time)."""
    suffix = ".json" + _compression(checkpoint)
    candidates = [
        Path(f"{checkpoint}.bak"),
        *(p for p in _files(meta / "backups" / project / stack) if p.name.endswith(suffix)),
        *(p for p in _files(meta / "history" / project / stack) if p.name.endswith(".checkpoint" + suffix)),
    ]

    def written(path: Path) -> int:
        match = _NS_RE.search(path.name)
        return int(match.group(1)) if match else path.stat().st_mtime_ns

    return sorted((p for p in candidates if p.is_file()), key=written, reverse=True)


def _compression(checkpoint: Path) -> str:
    """A checkpoint's compression suffix: ``""``, ``.gz`` or ``.zst``."""
    match = _CHECKPOINT_RE.match(checkpoint.name)
    return (match["compression"] or "") if match else ""


def _read_checkpoint(path: Path, compression: str) -> tuple[bytes | None, str | None]:
    """The file's bytes if they are a whole checkpoint (compressed as ``compression`` says), else None and
    what is wrong with them."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"
    if not raw:
        return None, "empty checkpoint"
    if compression == ".zst":
        # No zstd decoder in the standard library before Python 3.14: only its frame magic is checked.
        return (raw, None) if raw.startswith(_ZSTD_MAGIC) else (None, "not a zstd checkpoint")
    text = raw
    if compression == ".gz":
        try:
            text = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            return None, f"unreadable gzip checkpoint ({exc})"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"unreadable checkpoint JSON ({exc.msg} at byte {exc.pos} of {len(text)})"
    except ValueError as exc:
        return None, f"unreadable checkpoint ({exc})"
    if not (isinstance(data, dict) and isinstance(data.get("checkpoint"), dict) and "version" in data):
        return None, "not a Pulumi checkpoint (no version and checkpoint)"
    return raw, None


def _was_committing(temp: Path, compression: str, sidecar: dict[str, object] | None) -> bool:
    """A temp file the CLI was committing when it was killed: it is complete (it was closed before the
    sidecar was written), and the sidecar is torn or already describes it."""
    content, _ = _read_checkpoint(temp, compression)
    if content is None:
        return False
    return sidecar is None or sidecar.get("md5") == _md5(content)


def _install(target: Path, data: bytes, meta: Path, quarantine: Path, temp: Path | None) -> None:
    """Put ``data`` in place of ``target`` as the CLI writes: temp file, sidecar, rename (a crash in
    between leaves what :func:`scan` repairs). The damaged ``target`` is copied to the quarantine first."""
    if temp is None:
        _copy_aside(target, meta, quarantine)
        _copy_aside(_sidecar(target), meta, quarantine)
        temp = target.with_name(f"{target.name}.{time.time_ns():x}.tmp")
        temp.write_bytes(data)
    _write_sidecar(target, data)
    os.replace(temp, target)


# --- sidecars and temp files ------------------------------------------------------------------------


def _check_plain_file(meta: Path, path: Path, stack: str | None) -> list[Damage]:
    """A file that is not a checkpoint: a sidecar that cannot be read or has no file, a leftover temp file."""
    if _TMP_RE.match(path.name):
        return [_leftover(path, meta, stack)]
    if not path.name.endswith(_ATTRS):
        return []
    data = path.with_name(path.name[: -len(_ATTRS)])
    if not data.exists():
        return [
            Damage(
                path,
                f"the sidecar of {data.name}, which is gone (a delete killed half-way)",
                "remove it",
                stack,
                fix=lambda _q: path.unlink(missing_ok=True),
            )
        ]
    return [_rewrite_sidecar(path, data, stack)] if _read_attrs(path) is None else []


def _rewrite_sidecar(attrs: Path, data: Path, stack: str | None) -> Damage:
    return Damage(
        attrs,
        f"{'empty' if _is_empty(attrs) else 'unreadable'} sidecar of {data.name} (a write killed half-way): "
        "every read of that file fails on it (error: EOF)",
        f"write it anew from {data.name}",
        stack,
        fix=lambda _q: _write_sidecar(data, data.read_bytes()),
    )


def _leftover(temp: Path, meta: Path, stack: str | None) -> Damage:
    return Damage(
        temp,
        "leftover temp file of a write that was killed",
        "move it to the quarantine",
        stack,
        fix=lambda q: _move_aside(temp, meta, q),
    )


def _read_attrs(attrs: Path) -> dict[str, object] | None:
    """A sidecar's fields: ``{}`` when there is none (the CLI takes defaults), None when it cannot be read."""
    try:
        data = json.loads(attrs.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_sidecar(data_path: Path, data: bytes) -> None:
    """The sidecar fileblob writes (its field names; the content type Go detects for these files)."""
    fields = {
        "user.cache_control": "",
        "user.content_disposition": "",
        "user.content_encoding": "",
        "user.content_language": "",
        "user.content_type": "application/x-gzip" if data.startswith(b"\x1f\x8b") else "text/plain; charset=utf-8",
        "user.metadata": None,
        "md5": _md5(data),
    }
    _sidecar(data_path).write_text(json.dumps(fields, separators=(",", ":")) + "\n")


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()


def _is_empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + _ATTRS)


def _temps_of(path: Path) -> list[Path]:
    """fileblob's temp files for ``path``, newest first."""
    temps = []
    for temp in _files(path.parent):
        match = _TMP_RE.match(temp.name)
        if match and match["name"] == path.name:
            temps.append((int(match["ns"], 16), temp))
    return [t for _, t in sorted(temps, reverse=True)]


def _copy_aside(path: Path, meta: Path, quarantine: Path) -> None:
    if path.is_file():
        target = quarantine / path.relative_to(meta)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)


def _move_aside(path: Path, meta: Path, quarantine: Path) -> None:
    if path.is_file():
        target = quarantine / path.relative_to(meta)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)


# --- walking the backend ------------------------------------------------------------------------------


def _files(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_file()]
    except OSError:
        return []


def _backend_files(meta: Path, project: str) -> list[Path]:
    """The files of ``project`` (and the backend's own) that the CLI reads or lists."""
    found = [p for p in _files(meta) if p.name.startswith("meta.yaml")]
    for kind in ("stacks", "history", "backups"):
        found += sorted(p for p in (meta / kind / project).rglob("*") if p.is_file())
    found += sorted(p for p in (meta / "locks").glob(f"*/{project}/*/*") if p.is_file())
    return found


def _stack_of(meta: Path, path: Path) -> str | None:
    """The stack a backend file belongs to, from where it lies: ``stacks/<project>/<stack>.json...``,
    ``history|backups/<project>/<stack>/...``, ``locks/<org>/<project>/<stack>/...``."""
    parts = path.relative_to(meta).parts
    if parts[0] == "stacks" and len(parts) == 3:
        match = _STACK_FILE_RE.match(parts[2])
        return match["stack"] if match else None
    if parts[0] in ("history", "backups") and len(parts) == 4:
        return parts[2]
    if parts[0] == "locks" and len(parts) == 5:
        return parts[3]
    return None
