"""Leasing units of a pool so two runs never share one, on this host or across hosts sharing a backend.

A lease has two parts:

* **The host-local lock** (the fast path): ``<home>/leases/<stack>/<unit>.lock``, an exclusive
  ``flock`` (``filelock``) held for as long as the unit is used. The kernel drops it when the process
  dies, so a crashed run never leaves a unit leased, and two runs of one home never race further.
* **The lease record** in the Pulumi backend's storage, for runs of other homes and other hosts that
  share the backend (``PULUMI_BACKEND_URL``): ``<backend>/.ale-iac/leases/<stack>/<unit>.json`` with an
  owner and an expiry (:class:`RecordStore`). It is created atomically (a hard link: exactly one
  creator wins), renewed while the unit runs (every third of its time to live, by one thread per
  process), removed on release, and taken over once it has expired (or at once when its owner was a
  process on this host that is gone). Records are kept for ``file://`` backends, the shared file
  system being the storage; other backends keep no records (:func:`record_store` says so), so their
  leases are host-local only (see docs/experiments.md).

Expiry compares wall clocks of different hosts: their clocks must agree to well within
``TAKEOVER_GRACE_S``, which a takeover waits beyond the expiry.

The *dirty marker* (the unit may hold a task's leftovers and needs a reset before its next lease)
lives beside the record, so every home sharing the backend sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from filelock import FileLock, Timeout

from ale_iac import procs
from ale_iac.errors import AleIacError
from ale_iac.paths import ale_home, home_id

LEASE_TTL_S: Final = 60.0
"""How long a lease record stays valid without a renewal."""
TAKEOVER_GRACE_S: Final = 15.0
"""How long past its expiry a record of another host is left alone (clock skew between hosts)."""
RECORDS_DIR: Final = ".ale-iac/leases"
POLL_MAX_S: Final = 0.5
"""The longest wait between two tries for a lease held by another process (same-process releases wake
a waiter at once)."""


class LeaseLostError(AleIacError):
    """A lease record was taken over (its renewal came too late) or removed by someone else."""


# --- lease records in the backend's storage ------------------------------------------------------


@dataclass(frozen=True)
class Owner:
    """Who holds a record: enough to tell a live holder from a dead one on its own host."""

    token: str
    host: str
    home: str
    pid: int
    pid_started: float | None

    @classmethod
    def this_process(cls) -> Owner:
        return cls(
            token=secrets.token_hex(8),
            host=socket.gethostname(),
            home=home_id(),
            pid=os.getpid(),
            pid_started=procs.start_time(os.getpid()),
        )

    def gone(self) -> bool:
        """Whether the holder is known to be dead: a process on this host that no longer runs."""
        return self.host == socket.gethostname() and not procs.is_running(self.pid, self.pid_started)


@dataclass(frozen=True)
class Record:
    owner: Owner
    expires: float
    """Wall-clock seconds since the epoch."""

    def to_json(self) -> str:
        return json.dumps({"owner": self.owner.__dict__, "expires": self.expires})

    @classmethod
    def parse(cls, text: str) -> Record:
        data: dict[str, Any] = json.loads(text)
        return cls(owner=Owner(**data["owner"]), expires=float(data["expires"]))

    def takeable(self, now: float) -> bool:
        return self.owner.gone() or now > self.expires + TAKEOVER_GRACE_S


class RecordStore:
    """Lease records of one backend: one JSON file per leased unit, changed only by atomic file operations.

    * acquire: write the record under a temp name, ``link`` it into place (fails if one exists);
    * take over: ``rename`` the stale record aside (only one taker's rename finds it), check that what
      was moved is the stale record read before (else its owner renewed in between: put it back), then
      acquire;
    * renew: replace the record by ``rename`` if it is still ours;
    * release: unlink it if it is still ours.
    """

    def __init__(self, root: Path, ttl_s: float = LEASE_TTL_S) -> None:
        self.root = root
        self.ttl_s = ttl_s

    def _path(self, stack: str, unit: str) -> Path:
        return self.root / stack / f"{unit}.json"

    def folder(self, stack: str) -> Path:
        return self.root / stack

    def _write_temp(self, stack: str, record: Record) -> Path:
        folder = self.root / stack
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".tmp-{record.owner.token}-{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(record.to_json())
        return tmp

    def read(self, stack: str, unit: str) -> Record | None:
        try:
            return Record.parse(self._path(stack, unit).read_text())
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            # Half a record cannot exist (records are linked into place whole); an unreadable one is
            # treated as expired long ago, so it is taken over rather than blocking the unit forever.
            return Record(Owner("unreadable", "", "", 0, None), expires=0.0)

    def try_acquire(self, stack: str, unit: str, owner: Owner) -> bool:
        path = self._path(stack, unit)
        tmp = self._write_temp(stack, Record(owner, time.time() + self.ttl_s))
        try:
            for _ in range(3):
                try:
                    os.link(tmp, path)
                    return True
                except FileExistsError:
                    pass
                if not self._take_over_if_stale(stack, unit):
                    return False
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def _take_over_if_stale(self, stack: str, unit: str) -> bool:
        """Move a stale record out of the way; False if the current record is valid."""
        path = self._path(stack, unit)
        try:
            seen = path.read_text()
        except FileNotFoundError:
            return True
        current = self.read(stack, unit)
        if current is not None and not current.takeable(time.time()):
            return False
        aside = path.with_name(f".stale-{secrets.token_hex(6)}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True  # another taker moved it: race for the free slot
        try:
            if aside.read_text() != seen:
                # Renewed (or re-leased) between the read and the rename: put the live record back.
                with contextlib.suppress(FileExistsError):
                    os.link(aside, path)
                return False
            return True
        finally:
            aside.unlink(missing_ok=True)

    def renew(self, stack: str, unit: str, owner: Owner) -> None:
        current = self.read(stack, unit)
        if current is None or current.owner.token != owner.token:
            raise LeaseLostError(f"the lease of unit '{unit}' of pool '{stack}' was lost (record gone or not ours)")
        tmp = self._write_temp(stack, Record(owner, time.time() + self.ttl_s))
        os.replace(tmp, self._path(stack, unit))

    def release(self, stack: str, unit: str, owner: Owner) -> None:
        current = self.read(stack, unit)
        if current is not None and current.owner.token == owner.token:
            self._path(stack, unit).unlink(missing_ok=True)


def record_store(backend_url: str | None) -> RecordStore | None:
    """Where lease records of pools in ``backend_url`` live (None: the backend keeps none)."""
    if backend_url is None or not backend_url.startswith("file://"):
        return None
    return RecordStore(Path(backend_url[len("file://") :]).expanduser() / RECORDS_DIR)


class _Renewer:
    """One thread per process that renews every held record each third of its time to live."""

    def __init__(self) -> None:
        self._held: dict[int, Lease] = {}
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, lease: Lease) -> None:
        with self._guard:
            self._held[id(lease)] = lease
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="ale-lease-renewer", daemon=True)
                self._thread.start()

    def remove(self, lease: Lease) -> None:
        with self._guard:
            self._held.pop(id(lease), None)

    def _loop(self) -> None:
        while True:
            with self._guard:
                held = list(self._held.values())
                if not held:
                    self._thread = None
                    return
            time.sleep(min((lease.ttl_s for lease in held), default=LEASE_TTL_S) / 3)
            for lease in held:
                lease.renew()


_renewer = _Renewer()


# --- leases ---------------------------------------------------------------------------------------


@dataclass
class Lease:
    stack: str
    unit: str
    lock: FileLock | None
    store: RecordStore | None = None
    owner: Owner | None = None
    lost: str | None = None
    """Why the lease record was lost, if it was (the unit may be in use by another run since)."""
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def ttl_s(self) -> float:
        return self.store.ttl_s if self.store is not None else LEASE_TTL_S

    def renew(self) -> None:
        with self._guard:
            if self.store is None or self.owner is None or self.lost is not None:
                return
            try:
                self.store.renew(self.stack, self.unit, self.owner)
            except (LeaseLostError, OSError) as exc:
                self.lost = str(exc)

    def release(self) -> None:
        _renewer.remove(self)
        with self._guard:
            if self.store is not None and self.owner is not None and self.lost is None:
                with contextlib.suppress(OSError):
                    self.store.release(self.stack, self.unit, self.owner)
            self.store = None
            if self.lock is not None:
                self.lock.release()
                self.lock = None
        _wake_waiters(self.stack)


def lock_dir(stack: str) -> Path:
    return ale_home() / "leases" / stack


def forget_stack(stack: str, store: RecordStore | None) -> None:
    """Remove a destroyed stack's leases: this home's locks, and its records and dirty markers in the backend."""
    shutil.rmtree(lock_dir(stack), ignore_errors=True)
    if store is not None:
        shutil.rmtree(store.folder(stack), ignore_errors=True)


def dirty_marker(stack: str, unit: str, store: RecordStore | None) -> Path:
    """Exists while a lease of the unit may have changed it and no reset has followed (beside its record,
    where every home sharing the backend sees it; else beside its lock)."""
    folder = store.folder(stack) if store is not None else lock_dir(stack)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{unit}.dirty"


def try_lease(stack: str, units: Iterable[str], store: RecordStore | None = None) -> Lease | None:
    folder = lock_dir(stack)
    folder.mkdir(parents=True, exist_ok=True)
    owner = Owner.this_process() if store is not None else None
    for unit in sorted(units):
        # thread_local=False: a lease is taken in the event loop and may be released from any thread.
        # No soft-lock fallback (it would outlive a crash) and the file stays (unlinking a lock file on
        # release lets two later holders lock two different files).
        lock = FileLock(
            folder / f"{unit}.lock",
            mode=0o600,
            thread_local=False,
            fallback_to_soft=False,
            preserve_lock_file=True,
        )
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue
        if store is not None and owner is not None:
            try:
                taken = store.try_acquire(stack, unit, owner)
            except BaseException:
                lock.release()
                raise
            if not taken:  # held by a run of another home or host
                lock.release()
                continue
        lease = Lease(stack=stack, unit=unit, lock=lock, store=store, owner=owner)
        if store is not None:
            _renewer.add(lease)
        return lease
    return None


_waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
_waiters_guard = threading.Lock()


def _wake_waiters(stack: str) -> None:
    """A lease of ``stack`` was released in this process: wake its waiters now rather than at their next poll."""
    with _waiters_guard:
        waiting = list(_waiters.get(stack, ()))
    for loop, event in waiting:
        with contextlib.suppress(RuntimeError):  # that loop has closed
            loop.call_soon_threadsafe(event.set)


async def lease(stack: str, units: Iterable[str], timeout_s: float, store: RecordStore | None = None) -> Lease:
    """Wait (up to ``timeout_s``) for a free unit of the pool and lease it.

    A release in this process wakes the waiter at once; a release elsewhere is seen at the next poll
    (every 50 ms at first, backing off to ``POLL_MAX_S``).
    """
    names = list(units)
    if not names:
        raise AleIacError(f"pool stack '{stack}' exports no units")
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    waiter = (asyncio.get_running_loop(), asyncio.Event())
    with _waiters_guard:
        _waiters.setdefault(stack, set()).add(waiter)
    try:
        while True:
            waiter[1].clear()
            got = try_lease(stack, names, store)
            if got is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                raise AleIacError(f"no free unit in pool '{stack}' after {timeout_s:.0f} s (all {len(names)} leased)")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(delay, left)):  # not wait_for: it can drop a cancel (gh-86296)
                    await waiter[1].wait()
            delay = min(delay * 2, POLL_MAX_S)
    finally:
        with _waiters_guard:
            _waiters[stack].discard(waiter)
