"""`ale-iac gc` after crashes of the engine itself: state files torn as a SIGKILL tears them, and real
SIGKILLs of the CLI (with the engine's provider process) at random points of ``up`` and ``destroy``.

Real engine, file backend, real local sandboxes. Nothing may be left running afterwards: no stack, no
sandbox state folder, no process of a sandbox of this home.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import select
import signal
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ale_iac import procs
from ale_iac.contract import UnitSpec
from ale_iac.engine import PROJECT, Engine
from ale_iac.errors import AleIacError
from ale_iac.infra.program import inline_program
from ale_iac.paths import home_id
from ale_iac.profile import Profile, resolve_profile
from ale_iac.provision import UNIT_NAME, up_unit
from ale_iac.runner.gc import collect
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.cli import ale_iac

# One xdist group: the module's tests on one worker. What they count (stacks, sandboxes, processes) is their
# own home's, and gc's host-wide sweeps take only what a dead process left, so the other worker may run anything.
pytestmark = [
    pytest.mark.needs_root,
    pytest.mark.sandbox,
    pytest.mark.engine,
    pytest.mark.xdist_group("gc-crashes"),
    pytest.mark.timeout(420),
]


@pytest.fixture(autouse=True)
def _stop_what_is_left() -> Iterator[None]:
    """A failing test still leaves no sandbox running (its home's folder is deleted later by pytest)."""
    yield
    for state in local_sandboxes.list_sandboxes():
        local_runtime.stop(state.sandbox_id)


def _local() -> Profile:
    return resolve_profile("local").profile


def _meta(engine: Engine) -> Path:
    """The file backend's own folder (the default backend: ``state/`` in the home)."""
    return engine.home / "state" / ".pulumi"


def _checkpoint(engine: Engine, stack: str) -> Path:
    return _meta(engine) / "stacks" / PROJECT / f"{stack}.json"


def _temp_name(path: Path) -> Path:
    """A temp file name as the CLI's blob store makes it: the final name, hex nanoseconds, ``.tmp``."""
    return path.with_name(f"{path.name}.{time.time_ns():x}.tmp")


def _sandbox_processes(home: Path) -> list[str]:
    """Processes of this home's local sandboxes: a sandbox folder in their argv or as their working dir."""
    folder = str(local_sandboxes.sandboxes_dir(home))
    found = []
    for pid in procs.all_pids():
        argv = procs.argv(pid)
        if any(folder in arg for arg in argv) or (procs.cwd(pid) or "").startswith(folder):
            found.append(f"{pid}: {' '.join(argv)}")
    return found


def _assert_nothing_left(engine: Engine) -> None:
    assert engine.list_stacks() == []
    assert local_sandboxes.list_sandboxes() == []
    assert _sandbox_processes(engine.home) == []


def _state_files(engine: Engine) -> dict[str, bytes]:
    return {str(p.relative_to(_meta(engine))): p.read_bytes() for p in _meta(engine).rglob("*") if p.is_file()}


def _tear(engine: Engine, stacks: dict[str, str]) -> list[str]:
    """Tear the files of stacks ``a``, ``c``, ``d`` and ``e`` as the test below says; the damaged files."""
    meta = _meta(engine)
    a, c, d, e = (_checkpoint(engine, stacks[key]) for key in "acde")
    _temp_name(a).write_bytes(a.read_bytes())
    a.write_bytes(Path(f"{a}.bak").read_bytes())
    Path(f"{a}.attrs").write_bytes(b"")
    c.write_bytes(c.read_bytes()[:300])
    for folder in (meta / "backups" / PROJECT / stacks["d"], meta / "history" / PROJECT / stacks["d"]):
        for path in folder.glob("*.json"):
            path.write_bytes(path.read_bytes()[:50])
    Path(f"{d}.bak").write_bytes(b"")
    d.write_bytes(d.read_bytes()[:200])
    leftover = _temp_name(e)
    leftover.write_bytes(e.read_bytes()[:120])
    Path(f"{e}.bak.attrs").write_bytes(b"")
    (meta / "meta.yaml.attrs").write_bytes(b"")
    return [f"{a}.attrs", str(c), str(d), str(leftover), f"{e}.bak.attrs", str(meta / "meta.yaml.attrs")]


def test_gc_repairs_torn_state_files_and_stops_every_sandbox() -> None:
    """Four live sandboxes, their stacks' files torn four ways (what a SIGKILL of the CLI leaves):

    * ``a``: killed while it committed a write (empty ``.attrs``, the complete new version in a temp file);
    * ``c``: its checkpoint cut short (restored from the newest earlier version the engine keeps);
    * ``d``: its checkpoint and every earlier version unreadable (quarantined; its sandbox found by its
      state folder and stopped);
    * ``e``: a sandbox kept on purpose (``sbx-``), with a leftover temp file and an empty ``.bak.attrs``;
      and the backend's ``meta.yaml.attrs`` empty, which fails every CLI command.
    """
    engine = Engine()
    profile = _local()
    stacks = {key: f"{'sbx' if key == 'e' else 'run'}-{home_id()}-{key}" for key in "acde"}
    sandbox = {
        key: up_unit(engine, profile, stack, UnitSpec(name=UNIT_NAME)).resource_id for key, stack in stacks.items()
    }
    bad = _tear(engine, stacks)
    d = _checkpoint(engine, stacks["d"])

    listed = ale_iac("sandbox", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert sorted(row["stack"] for row in json.loads(listed.stdout)) == sorted(stacks.values())
    assert all(f"damaged state file {path}: " in listed.stderr for path in bad), listed.stderr

    before = _state_files(engine)
    dry = ale_iac("gc", "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert all(f"would repair damaged state file {path}: " in dry.stdout for path in bad), dry.stdout
    assert f"would destroy stack {stacks['a']}" in dry.stdout and f"would destroy stack {stacks['c']}" in dry.stdout
    # d's stack is beyond repair: no stack will list its sandbox. a's and c's cannot be read until repaired.
    stops = [line.split()[-1] for line in dry.stdout.splitlines() if line.startswith("would stop")]
    assert stops == [sandbox["d"]]
    assert _state_files(engine) == before and len(local_sandboxes.list_sandboxes()) == 4

    done = ale_iac("gc")
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"repaired damaged state file {path}: " in done.stdout for path in bad), done.stdout
    assert f"stopped orphaned sandbox {sandbox['d']}" in done.stdout
    assert [s.name for s in engine.list_stacks()] == [stacks["e"]]
    assert [s.sandbox_id for s in local_sandboxes.list_sandboxes()] == [sandbox["e"]]
    assert all(sandbox["e"] in line for line in _sandbox_processes(engine.home)), _sandbox_processes(engine.home)
    assert list((engine.home / "quarantine").glob(f"*/stacks/{PROJECT}/{d.name}"))

    listed = ale_iac("sandbox", "ls", "--json")
    assert listed.returncode == 0 and "damaged" not in listed.stderr, listed.stderr
    assert [(row["stack"], row["provider"]) for row in json.loads(listed.stdout)] == [(stacks["e"], "local")]
    destroyed = ale_iac("sandbox", "destroy", stacks["e"])
    assert destroyed.returncode == 0, destroyed.stderr
    _assert_nothing_left(engine)


# --- real SIGKILLs -----------------------------------------------------------------------------------

KILLS = 30
LANES = 4
"""Operations run (and killed) at once per round: a round's kills cost one gc."""
_IN_CREATE = 0x100
_libc = ctypes.CDLL(None, use_errno=True)


class _Creations:
    """Names of the files created in a folder, as they appear (inotify: no polling, no delay)."""

    def __init__(self, folder: Path) -> None:
        self.fd = _libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
        if self.fd < 0 or _libc.inotify_add_watch(self.fd, os.fsencode(folder), _IN_CREATE) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")

    def wait(self, timeout: float) -> list[str]:
        if not select.select([self.fd], [], [], timeout)[0]:
            return []
        data, names, at = os.read(self.fd, 65536), [], 0
        while at < len(data):
            length = struct.unpack_from("iIII", data, at)[3]
            names.append(data[at + 16 : at + 16 + length].rstrip(b"\0").decode())
            at += 16 + length
        return names

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class _KillPoint:
    """Where in an operation its CLI is killed: some seconds in, or as it starts its n-th write of the
    stack's state (the creation of the n-th temp file of ``<stack>.json``, counted from 0)."""

    after_s: float | None = None
    at_write: int = 0


@dataclass
class _Tally:
    kills: Counter[str] = field(default_factory=Counter)
    repairs: Counter[str] = field(default_factory=Counter)
    rounds: int = 0
    gc_seconds: float = 0.0

    def total(self) -> int:
        return sum(self.kills.values())


class _Lane:
    """One engine of its own, whose CLI and provider process are killed together: a crash of that engine."""

    def __init__(self, profile: Profile) -> None:
        self.engine = Engine()
        self.profile = profile
        self.stacks_folder = _meta(self.engine) / "stacks" / PROJECT

    def up(self, stack: str, initialized: bool = False) -> None:
        program = inline_program(self.profile, [UnitSpec(name=UNIT_NAME)], stack)
        self.engine.up_new(stack, program, initialized=initialized)

    def writes_of(self, operation: Callable[[], None], stack: str) -> int:
        """Run ``operation`` whole; how many times it wrote the stack's state."""
        created = self._creations()
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(operation)
            writes = 0
            while not future.done():
                writes += _state_writes(created.wait(0.05), stack)
            future.result()
        writes += _state_writes(created.wait(0), stack)
        created.close()
        return writes

    def killed_during(self, operation: Callable[[], None], stack: str, point: _KillPoint) -> str | None:
        """Run ``operation`` and SIGKILL its CLI (and this engine's provider process) at ``point``; returns
        the CLI command killed, None if the operation ended first (then its own error, if any, is raised)."""
        created = self._creations()
        started = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(operation)
            try:
                clis: dict[int, tuple[float, str]] = {}
                writes = 0
                while not future.done():
                    # Found ahead (so that a kill at a write is not late), and found anew once they have
                    # ended (``recover`` runs ``cancel``, then ``destroy``).
                    if not any(procs.is_running(pid, at) for pid, (at, _) in clis.items()):
                        clis = _clis_of(stack)
                    writes += _state_writes(created.wait(0.002), stack)
                    due = (
                        time.monotonic() - started >= point.after_s
                        if point.after_s is not None
                        else writes > point.at_write
                    )
                    if due and clis and self._kill(clis):
                        with contextlib.suppress(AleIacError):  # the killed CLI's error: the crash made here
                            future.result()
                        return next(iter(clis.values()))[1]
            finally:
                created.close()
            future.result()
            return None

    def _creations(self) -> _Creations:
        self.stacks_folder.mkdir(parents=True, exist_ok=True)
        return _Creations(self.stacks_folder)

    def _kill(self, clis: dict[int, tuple[float, str]]) -> bool:
        """SIGKILL the CLIs and this engine's provider process; whether a CLI was still there to kill."""
        killed = False
        for pid, (started_at, _) in clis.items():
            if procs.is_running(pid, started_at):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed = True
        provider = self.engine.provider_pid
        if killed and provider:
            with contextlib.suppress(ProcessLookupError):
                os.kill(provider, signal.SIGKILL)
        return killed


def _state_writes(created: list[str], stack: str) -> int:
    """How many of the files ``created`` start a write of the stack's state (its checkpoint or ``.bak``)."""
    return sum(name.startswith(f"{stack}.json") and name.endswith(".tmp") for name in created)


def _clis_of(stack: str) -> dict[int, tuple[float, str]]:
    """This process's live ``pulumi`` CLIs working on ``stack``: their start time and command (``up``, ...)."""
    found = {}
    for pid in procs.descendants(os.getpid())[1:]:
        argv, started_at = procs.argv(pid), procs.start_time(pid)
        if argv and os.path.basename(argv[0]) == "pulumi" and stack in argv and started_at is not None:
            found[pid] = (started_at, next((a for a in argv[1:] if not a.startswith("-")), "?"))
    return found


@dataclass(frozen=True)
class _Span:
    """An operation measured whole: its seconds, and how many times it wrote the stack's state."""

    seconds: float
    writes: int

    @classmethod
    def of(cls, lane: _Lane, operation: Callable[[], None], stack: str) -> _Span:
        started = time.monotonic()
        writes = lane.writes_of(operation, stack)
        return cls(time.monotonic() - started, writes)

    def point(self, rng: random.Random) -> _KillPoint:
        """A random point of the span: a time into it, or one of its state writes (where a kill tears files)."""
        if rng.random() < 0.5:
            return _KillPoint(after_s=rng.uniform(0, self.seconds))
        return _KillPoint(at_write=rng.randrange(self.writes))


def _up_then_destroy(lane: _Lane, stack: str, up_at: _KillPoint, destroy_at: _KillPoint) -> list[str]:
    """A local sandbox's stack made (``stack init``), brought up, then destroyed as a crashed run's cleanup
    would (``Engine.recover``: release the stale lock, destroy), each of the two killed at its point.
    Returns what was killed. What a kill did not stop must work, except a destroy after a killed ``up``:
    that kill may have torn the state it reads (``gc`` repairs it)."""
    lane.engine.init(stack)  # as the runner makes a waiting unit's stack ahead
    killed = [lane.killed_during(lambda: lane.up(stack, initialized=True), stack, up_at)]
    try:
        killed.append(lane.killed_during(lambda: lane.engine.recover(stack), stack, destroy_at))
    except AleIacError:
        if killed[0] is None:
            raise
        killed.append(None)
    return [
        f"pulumi {command} at {'a time' if where.after_s is not None else 'a state write'}"
        for command, where in zip(killed, (up_at, destroy_at), strict=True)
        if command is not None
    ]


@contextlib.contextmanager
def _seed_on_failure(seed: int) -> Iterator[None]:
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n(reproduce the kill points with ALE_IAC_TEST_SEED={seed})") from exc


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the SDK's, its CLI killed
def test_sigkills_at_random_points_of_up_and_destroy_are_all_recovered_by_gc() -> None:
    """Rounds of ``LANES`` lanes at once, each bringing a local sandbox up and destroying it, both operations
    killed at random points of their spans as measured first; after each round ``gc``, and nothing is left."""
    seed = int(os.environ.get("ALE_IAC_TEST_SEED") or random.randrange(1 << 32))
    rng = random.Random(seed)
    tally = _Tally()
    with _seed_on_failure(seed), contextlib.ExitStack() as engines:
        lanes = [_Lane(_local()) for _ in range(LANES)]
        gc_engine = Engine()
        for engine in (gc_engine, *(lane.engine for lane in lanes)):
            engines.callback(engine.close)
        warm, first = f"run-{home_id()}-warm", lanes[0]
        first.engine.init(warm)
        up = _Span.of(first, lambda: first.up(warm, initialized=True), warm)
        destroy = _Span.of(first, lambda: first.engine.destroy(warm), warm)
        started = time.monotonic()
        while tally.total() < KILLS:
            tally.rounds += 1
            plans = [
                (lane, f"run-{home_id()}-k{tally.rounds}-{n}", up.point(rng), destroy.point(rng))
                for n, lane in enumerate(lanes)
            ]
            with ThreadPoolExecutor(LANES) as pool:
                for kills in pool.map(lambda plan: _up_then_destroy(*plan), plans):
                    tally.kills.update(kills)
            gc_started = time.monotonic()
            report = collect(gc_engine)
            tally.gc_seconds += time.monotonic() - gc_started
            tally.repairs.update(
                d.problem.split(" (")[0].replace(d.stack or "", "<stack>") for d in report.state_repairs
            )
            assert report.errors == [], f"round {tally.rounds}: {report.errors}"
            _assert_nothing_left(gc_engine)
    print(
        f"\nseed {seed}: {tally.total()} kills in {tally.rounds} rounds, {time.monotonic() - started:.0f} s, "
        f"{tally.gc_seconds:.0f} s of it in gc (up: {up.seconds:.1f} s, {up.writes} state writes; destroy: "
        f"{destroy.seconds:.1f} s, {destroy.writes} writes); kills {dict(tally.kills)}; "
        f"torn files repaired {dict(tally.repairs)}"
    )
