"""The Automation API seam: every stack operation ale-iac performs goes through :class:`Engine`.

What it adds to ``pulumi.automation``:

* one work dir per operation, under ``<home>/work``, always removed afterwards (the SDK creates
  ``automation-*`` temp dirs and never removes them); dirs left by a killed process are swept. It is also
  the CLI's and its plugins' ``TMPDIR`` (the Kubernetes provider copies the kubeconfig to a temp file on
  every call and never removes it), and the CLI's record of the stack it selected there
  (``<Pulumi home>/workspaces/ale-iac-<sha1>-workspace.json``, one per project folder, never removed by the
  CLI) goes with it;
* the local ``file://`` backend under ``<home>/state`` by default, any backend via ``PULUMI_BACKEND_URL``;
* a Pulumi home of its own, ``<home>/pulumi`` (unless ``PULUMI_HOME`` is set): every CLI call writes a log
  file to ``<Pulumi home>/logs`` and, before that, stats every file there to rotate them (7 days or 500 MB by
  default: 35,000 files after a day of runs, 0.2 s of each call). Ours is rotated at
  ``PULUMI_LOG_ROTATION_MAX_TOTAL_MB`` = :data:`LOG_ROTATION_MAX_TOTAL_MB`, and shares the user's
  ``plugins`` and ``credentials.json`` through links (:func:`ensure_pulumi_home`);
* the secrets passphrase from ``PULUMI_CONFIG_PASSPHRASE(_FILE)`` or a generated 0600 file;
* ``PULUMI_PYTHON_CMD`` set to this interpreter, so dynamic providers can import ``ale_iac``;
* engine output streamed to ``<home>/logs/stacks/<stack>.log``;
* typed errors with the engine's own message;
* blocking calls that are safe from many threads at once (async callers run them in a worker thread,
  ``ale_iac.runner.provisioners.blocking``, so the asyncio loop never blocks).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
from pulumi import automation as auto
from pulumi.automation._server import LanguageServer  # not re-exported; what Stack.up/destroy serve
from pulumi.automation._stack import StackInitMode  # not re-exported; the SDK is not pinned
from pulumi.runtime import _grpc_settings  # the options of every channel an in-process program opens
from pulumi.runtime.proto import language_pb2_grpc

from ale_iac import filebackend, procs
from ale_iac.contract import UNITS_OUTPUT, UnitOutputs, parse_units
from ale_iac.errors import AleIacError
from ale_iac.paths import ale_home
from ale_iac.provider_host import MODULE as PROVIDER_HOST_MODULE
from ale_iac.provider_host import ProviderHost
from ale_iac.substrates import registry
from ale_iac.toolchain import Toolchain, find_toolchain, kube_bin_dir

PROJECT = "ale-iac"
Program = Callable[[], None]
OutputSink = Callable[[str], None]

_STACK_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")

LOG_ROTATION_MAX_TOTAL_MB: Final = 10
"""What the Pulumi CLI keeps of its own logs in ale-iac's Pulumi home (a few hundred to a few thousand files, of
5 to 30 kB each): each CLI call stats them all before it starts."""
SHARED_WITH_USER_HOME: Final = ("plugins", "credentials.json")
"""What ale-iac's Pulumi home links to the user's: the provider plugins the user installed (and where the CLI
installs one it needs), and the Pulumi Cloud login (a ``PULUMI_BACKEND_URL`` of Pulumi Cloud needs it)."""

OWN_SUBCHANNELS: Final = ("grpc.use_local_subchannel_pool", 1)
"""Each channel an in-process program opens to its CLI (monitor, engine) connects on its own.

By default grpc shares connections ("subchannels") process-wide between channels to the same address, their
failure state included. A program that calls its CLI after the CLI is gone (killed, timed out, or ended by a
provider's failure: the SDK then logs "Resource monitor has terminated" to the dead engine) leaves a refused
connection to that port, and for its reconnect backoff (1 s, longer after each refused call) a new channel to
the same address fails at once with "connection refused", without trying. A later CLI the kernel gives that
port would run its program unable to reach it: the unit's ``up`` fails (``wait_for_rpcs``: ``engine.Log``).
Appended to the SDK's channel options once, at import; servers ignore it."""
if OWN_SUBCHANNELS not in _grpc_settings._GRPC_CHANNEL_OPTIONS:
    _grpc_settings._GRPC_CHANNEL_OPTIONS.append(OWN_SUBCHANNELS)


class StackLockedError(AleIacError):
    """Another operation holds the stack's lock (or a killed one left it behind)."""


class StackNotFoundError(AleIacError):
    """The stack does not exist in the backend."""


class StackOperationError(AleIacError):
    """An engine operation failed; carries the engine's own error lines."""

    def __init__(self, stack: str, operation: str, message: str) -> None:
        self.stack = stack
        self.operation = operation
        self.engine_message = message
        super().__init__(f"pulumi {operation} of stack '{stack}' failed: {message}")


GENERIC_DIAGNOSTICS: Final = frozenset(
    [f"error: {op} failed" for op in ("update", "preview", "destroy", "refresh")]
    # The program's side of an update the engine ended (after a provider's failure, say): it races the
    # provider's own diagnostic, so it comes first in some runs and not at all in others.
    + ["error: Resource monitor has terminated, shutting down"]
)
"""The engine's summary diagnostics, which say only that the operation failed or ended; left out when another
says why."""
_TRACEBACK: Final = "Traceback (most recent call last):"
_QUALIFIED_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_]\w*(?:Error|Exception|Exit)\b)")


def engine_message(exc: BaseException) -> str:
    """The lines of a CLI failure a person needs (``error:`` diagnostics), not the whole transcript.

    A diagnostic that is a Python traceback (a dynamic provider's exception: a substrate's driver that
    failed) is its last line, the exception, not its first (``Traceback (most recent call last):``); the
    engine's ``error: update failed`` is left out when another diagnostic says why."""
    parts = [str(getattr(exc, attr, "") or "") for attr in ("stderr", "stdout")]
    text = "\n".join(p for p in parts if p) or str(exc)
    picked = _diagnostics(text.splitlines())
    if not picked:
        picked = [ln.strip() for ln in text.splitlines() if ln.strip()][-3:]
    specific = [line for line in picked if line not in GENERIC_DIAGNOSTICS]
    seen = list(dict.fromkeys(specific or picked))
    return " | ".join(seen)[:2000] or type(exc).__name__


def _diagnostics(lines: list[str]) -> list[str]:
    """One line per ``error:`` diagnostic of the engine's output: its first line, or for a traceback
    (its lines follow, indented at least as much as the ``error:``, up to a blank line) the exception
    it ends with, its module path left out."""
    picked = []
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not (stripped.startswith("error:") or "error:" in stripped[:40]):
            continue
        if not stripped.endswith(_TRACEBACK):
            picked.append(stripped)
            continue
        indent = len(line) - len(line.lstrip())
        body = []
        for follower in lines[index + 1 :]:  # the message's lines: as indented as its "error:", or more
            if not follower.strip() or len(follower) - len(follower.lstrip()) < indent:
                break
            if follower.strip().startswith(("error:", "warning:")):
                break
            body.append(follower.strip())
        picked.append(_QUALIFIED_EXCEPTION.sub("", body[-1]) if body else stripped)
    return picked


def check_stack_name(name: str) -> str:
    if not _STACK_NAME_RE.match(name):
        raise AleIacError(f"invalid stack name {name!r}: use letters, digits, '-', '_' or '.' (max 100)")
    return name


@dataclass(frozen=True)
class StackInfo:
    name: str
    last_update: str | None
    resource_count: int | None
    locked: bool


class Engine:
    """Runs Pulumi operations for project ``ale-iac`` against one backend."""

    def __init__(
        self, home: Path | None = None, toolchain: Toolchain | None = None, shared_providers: bool = True
    ) -> None:
        """``shared_providers=False``: every CLI call starts its own provider plugin, as plain ``pulumi``
        does (about 0.2 s slower per call here; ``bench/bench_engine.py --unit-path`` compares the two)."""
        self.home = (home or ale_home()).resolve()
        self.toolchain = toolchain or find_toolchain()
        self.backend_url = os.environ.get("PULUMI_BACKEND_URL") or f"file://{self.home / 'state'}"
        # Built once: constructing a PulumiCommand runs `pulumi version`.
        self._command = auto.PulumiCommand(root=str(self.toolchain.root))
        self._log_locks: dict[str, threading.Lock] = {}
        self._log_locks_guard = threading.Lock()
        self._settings: dict[str, auto.StackSettings] = {}
        """Stacks :meth:`init` made, by name: their settings (the passphrase salt), for their ``up``."""
        self._settings_guard = threading.Lock()
        self._prepare_home()
        self._secrets_env()  # create the passphrase file now, before threads race for it
        # Started on the first operation that needs providers; closed with the engine or at exit.
        # PULUMI_PROJECT: what the CLI sets for a provider plugin it starts itself.
        self._providers: ProviderHost | None = None
        if shared_providers:
            cli_env = {**self.env_vars(), "PULUMI_PROJECT": PROJECT}  # not ``self``: the finalizer must not hold it
            self._providers = ProviderHost(lambda: {**os.environ, **cli_env})
            weakref.finalize(self, self._providers.close)

    @property
    def provider_pid(self) -> int | None:
        """The pid of this engine's dynamic-provider process, while it runs."""
        return self._providers.pid if self._providers is not None else None

    def close(self) -> None:
        """Stop this engine's dynamic-provider process (started again if the engine is used again)."""
        if self._providers is not None:
            self._providers.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- setup -------------------------------------------------------------------------------

    @property
    def pulumi_home(self) -> Path:
        """The CLI's ``PULUMI_HOME``: the caller's, or ``<home>/pulumi``."""
        return Path(os.environ.get("PULUMI_HOME") or self.home / "pulumi")

    def _own_pulumi_home(self) -> bool:
        return not os.environ.get("PULUMI_HOME")

    def _prepare_home(self) -> None:
        for sub in ("work", "logs/stacks"):
            (self.home / sub).mkdir(parents=True, exist_ok=True)
        if self._own_pulumi_home():
            ensure_pulumi_home(self.pulumi_home)
        if self.backend_url.startswith("file://"):
            Path(self.backend_url[len("file://") :]).mkdir(parents=True, exist_ok=True)
        self.sweep_work_dirs()

    @property
    def passphrase_file(self) -> Path:
        return self.home / "passphrase"

    def _secrets_env(self) -> dict[str, str]:
        """Passphrase from the environment if given; else a generated one in a 0600 file."""
        if os.environ.get("PULUMI_CONFIG_PASSPHRASE") is not None:
            return {"PULUMI_CONFIG_PASSPHRASE": os.environ["PULUMI_CONFIG_PASSPHRASE"]}
        if os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
            return {"PULUMI_CONFIG_PASSPHRASE_FILE": os.environ["PULUMI_CONFIG_PASSPHRASE_FILE"]}
        path = self.passphrase_file
        if not path.exists():
            # Written whole under a temp name, then linked into place: a concurrent reader (another
            # thread or process sharing this home) never sees an empty passphrase, and the first
            # writer wins.
            tmp = path.with_name(f".passphrase-{os.getpid()}-{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(32))
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
            tmp.unlink()
        return {"PULUMI_CONFIG_PASSPHRASE_FILE": str(path)}

    def env_vars(self) -> dict[str, str]:
        """Environment for every CLI call (also what ``ale-iac doctor`` and tests use)."""
        dirs = [str(self.toolchain.bin_dir)]
        kube = kube_bin_dir()
        if (kube / "pulumi-resource-kubernetes").is_file():
            # The Kubernetes provider plugin that scripts/kube-cluster.sh built: the CLI takes it from PATH. After
            # the toolchain's folder, which stays first (``ale-iac env`` and the tests rely on it), whatever the
            # cache holds.
            dirs.append(str(kube))
        path = os.pathsep.join([*dirs, os.environ.get("PATH", "")])
        own_home = (
            {"PULUMI_HOME": str(self.pulumi_home), "PULUMI_LOG_ROTATION_MAX_TOTAL_MB": str(LOG_ROTATION_MAX_TOTAL_MB)}
            if self._own_pulumi_home()
            else {}
        )
        return {
            **own_home,
            "PULUMI_BACKEND_URL": self.backend_url,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_PYTHON_CMD": sys.executable,
            "PATH": path,
            **self._secrets_env(),
        }

    # -- work dirs -----------------------------------------------------------------------------

    def sweep_work_dirs(self) -> list[Path]:
        """Remove work dirs whose owning process is gone (left by a crash or SIGKILL)."""
        removed: list[Path] = []
        for entry in (self.home / "work").iterdir():
            match = re.match(r"^.+-p(\d+)-[0-9a-f]{8}$", entry.name)
            if not match or procs.alive(int(match.group(1))):
                continue
            _remove_work_dir(entry, self.pulumi_home)
            removed.append(entry)
        return removed

    @contextlib.contextmanager
    def _scratch(self, label: str) -> Iterator[tuple[Path, dict[str, str]]]:
        """A fresh work dir for one operation, and the environment of its CLI call: :meth:`env_vars` with
        ``TMPDIR`` in that dir, so that whatever the CLI and its plugins leave in their temp dir goes when
        the dir does (or is swept with it after a crash)."""
        work_dir = self.home / "work" / f"{label}-p{os.getpid()}-{secrets.token_hex(4)}"
        work_dir.mkdir(parents=True)
        scratch = work_dir / _TMP
        scratch.mkdir(mode=0o700)
        try:
            yield work_dir, {**self.env_vars(), "TMPDIR": str(scratch)}
        finally:
            _remove_work_dir(work_dir, self.pulumi_home)

    @contextlib.contextmanager
    def _workspace(self, label: str, program: Program | None, providers: bool = False) -> Iterator[auto.LocalWorkspace]:
        """A workspace in a fresh work dir that is removed when the block ends. With ``providers``, its
        CLI calls attach to this engine's dynamic-provider process (``ale_iac.provider_host``)."""
        with self._scratch(label) as (work_dir, env):
            if providers and self._providers is not None:
                env.update(self._providers.attach_env(os.environ))
            yield auto.LocalWorkspace(
                work_dir=str(work_dir),
                program=program or _empty_program,
                env_vars=env,
                pulumi_command=self._command,
                project_settings=auto.ProjectSettings(
                    name=PROJECT, runtime="python", backend=auto.ProjectBackend(url=self.backend_url)
                ),
            )

    @contextlib.contextmanager
    def _stack(self, name: str, program: Program | None, create: bool, providers: bool = False) -> Iterator[auto.Stack]:
        check_stack_name(name)
        with self._workspace(name, program, providers) as workspace:
            with self._errors(name, "stack select"):
                opener = auto.Stack.create_or_select if create else auto.Stack.select
                stack = opener(name, workspace)
            yield stack

    @contextlib.contextmanager
    def _errors(self, name: str, operation: str) -> Iterator[None]:
        """The SDK's errors of a CLI call as ours: not found, locked, or failed with the engine's own lines."""
        try:
            yield
        except auto.StackNotFoundError:
            raise StackNotFoundError(f"stack '{name}' does not exist in {self.backend_url}") from None
        except auto.ConcurrentUpdateError as exc:
            raise self._locked(name, exc) from None
        except auto.CommandError as exc:
            raise StackOperationError(name, operation, engine_message(exc)) from None

    def _locked(self, name: str, exc: BaseException) -> StackLockedError:
        return StackLockedError(
            f"stack '{name}' is locked by another operation ({engine_message(exc)}); if no ale-iac or "
            f"pulumi process is running on it, recover it with: ale-iac gc --stack {name}"
        )

    # -- logging -------------------------------------------------------------------------------

    def log_path(self, stack: str) -> Path:
        return self.home / "logs" / "stacks" / f"{stack}.log"

    def _sink(self, stack: str, operation: str, extra: OutputSink | None) -> OutputSink:
        with self._log_locks_guard:
            lock = self._log_locks.setdefault(stack, threading.Lock())
        path = self.log_path(stack)
        with lock, path.open("a") as handle:
            handle.write(f"==== pulumi {operation} (pid {os.getpid()})\n")

        def sink(line: str) -> None:
            # Called per line from the SDK's reader threads.
            with lock, path.open("a") as handle:
                handle.write(line.rstrip("\n") + "\n")
            if extra is not None:
                extra(line)

        return sink

    # -- operations ----------------------------------------------------------------------------

    def _run(self, name: str, operation: str, call: Callable[[], Any]) -> Any:
        with self._errors(name, operation):
            return call()

    def up(self, name: str, program: Program, on_output: OutputSink | None = None) -> dict[str, Any]:
        """Create or update the stack; returns its outputs as plain values."""
        with self._stack(name, program, create=True, providers=True) as stack:
            sink = self._sink(name, "up", on_output)
            result = self._run(name, "up", lambda: stack.up(on_output=sink, on_error=sink))
            return {key: value.value for key, value in result.outputs.items()}

    def init(self, name: str) -> None:
        """Create an empty stack (``pulumi stack init``) that an ``up_new(..., initialized=True)`` fills
        later: the runner creates a waiting unit's stack ahead of its turn, off its critical path."""
        check_stack_name(name)
        with self._workspace(name, None) as workspace, self._errors(name, "stack init"):
            workspace.create_stack(name)
            settings = workspace.stack_settings(name)
        with self._settings_guard:
            self._settings[name] = settings

    def up_new(
        self, name: str, program: Program, on_output: OutputSink | None = None, initialized: bool = False
    ) -> None:
        """Create a stack that must not exist yet and ``up`` it, in two CLI calls (``stack init``, ``up``);
        one (``up``) when :meth:`init` created it already (``initialized``).

        ``up`` returns no outputs: the caller's program hands them over itself while it runs (see
        ``ale_iac.infra.program.inline_program``'s ``on_units``). This is the ephemeral unit's path: the
        SDK's ``create_or_select`` + ``up`` would also run ``stack select`` (which fails first), ``stack
        output`` twice and ``stack history``, about 1.1 s of the 2.6 s a local unit's stack took.
        """
        check_stack_name(name)
        with self._workspace(name, program, providers=True) as workspace:
            with self._settings_guard:
                settings = self._settings.pop(name, None)
            if settings is not None:
                # The passphrase salt ``stack init`` chose, back in the stack's settings file: without it
                # the CLI would derive a key for a new salt and then another for the state's (PBKDF2 with
                # 1,000,000 rounds, 0.2 s of CPU each).
                workspace.save_stack_settings(name, settings)
            with self._errors(name, "stack init"):
                stack = _NoReadbackStack(name, workspace, create=not initialized)
            sink = self._sink(name, "up", on_output)
            self._run(name, "up", lambda: stack.up(on_output=sink, on_error=sink))

    def update_targets(
        self,
        name: str,
        program: Program,
        targets: Sequence[str],
        replace: Sequence[str] = (),
        on_output: OutputSink | None = None,
    ) -> None:
        """One ``up`` of an existing stack that changes only ``targets`` and what depends on them
        (``--target URN ... --target-dependents``), replacing ``replace`` (``--replace URN``): a targeted resource
        the program no longer declares is deleted, with its children. Whatever else the program declares is left
        as the stack has it. As :meth:`up_new`, no outputs are read back (the program hands them over itself).

        The stack's settings (its passphrase salt) are kept from one call to the next, so the CLI derives the
        stack's key once per call rather than twice (see :meth:`up_new`)."""
        check_stack_name(name)
        with self._workspace(name, program, providers=True) as workspace:
            with self._settings_guard:
                settings = self._settings.get(name)
            if settings is not None:
                workspace.save_stack_settings(name, settings)
            stack = _NoReadbackStack(name, workspace, create=False)
            sink = self._sink(name, "up --target", on_output)
            self._run(
                name,
                "up --target",
                lambda: stack.up(
                    target=list(targets),
                    replace=list(replace),
                    target_dependents=True,
                    on_output=sink,
                    on_error=sink,
                ),
            )
            if settings is None:
                with self._settings_guard:
                    self._settings[name] = workspace.stack_settings(name)

    def preview(self, name: str, program: Program, diff: bool = False) -> auto.PreviewResult:
        with self._stack(name, program, create=True, providers=True) as stack:
            sink = self._sink(name, "preview", None)
            result: auto.PreviewResult = self._run(
                name, "preview", lambda: stack.preview(diff=diff, on_output=sink, on_error=sink)
            )
            return result

    def destroy(self, name: str, remove: bool = True, on_output: OutputSink | None = None) -> None:
        """Destroy every resource of the stack, then (by default) remove the stack itself.

        One CLI call (``pulumi destroy --remove``): no ``stack select`` before it, no ``stack history``
        and ``stack rm`` after it, as the SDK's ``Stack.destroy`` would run. Destroy needs no program:
        dynamic providers are restored from the state. The CLI's language runtime is an empty program
        served from this process (``--client``, as the SDK does for inline programs), so no language
        host process starts either.
        """
        check_stack_name(name)
        with self._settings_guard:
            self._settings.pop(name, None)
        with self._workspace(name, None, providers=True) as workspace, _language_client(_empty_program) as client:
            sink = self._sink(name, "destroy", on_output)
            args = ["destroy", "--yes", "--skip-preview", "--stack", name, *(["--remove"] if remove else [])]
            with self._errors(name, "destroy"):
                self._command.run([*args, f"--client={client}"], workspace.work_dir, workspace.env_vars, sink, sink)

    def run_in_project(self, name: str, project: Path, args: list[str], operation: str) -> None:
        """One CLI call (``args``) on stack ``name`` with the program of the project in ``project`` (its
        ``Pulumi.yaml`` and stack config), as plain ``pulumi`` runs it there; logged to the stack's log and
        its errors translated like every other operation (a held lock: :class:`StackLockedError`)."""
        check_stack_name(name)
        sink = self._sink(name, operation, None)
        with self._scratch(name) as (_, env), self._errors(name, operation):
            self._command.run(args, str(project), env, sink, sink)

    def outputs(self, name: str) -> dict[str, Any]:
        with self._stack(name, None, create=False) as stack:
            values = self._run(name, "stack output", stack.outputs)
            return {key: value.value for key, value in values.items()}

    def units(self, name: str) -> dict[str, UnitOutputs]:
        """The unit handles a stack exports (see ``ale_iac.contract``)."""
        outputs = self.outputs(name)
        if UNITS_OUTPUT not in outputs:
            raise AleIacError(f"stack '{name}' exports no '{UNITS_OUTPUT}' output; is it an ale-iac stack?")
        return {name: live_outputs(unit) for name, unit in parse_units(outputs[UNITS_OUTPUT]).items()}

    def cancel(self, name: str) -> None:
        """Release a stale lock (``pulumi cancel``); the file backend just deletes the lock file. One CLI
        call, no ``stack select`` before it: recovering each stack a killed run left costs one call less."""
        check_stack_name(name)
        with self._workspace(name, None) as workspace, self._errors(name, "cancel"):
            self._command.run(["cancel", "--yes", "--stack", name], workspace.work_dir, workspace.env_vars)

    def remove(self, name: str) -> None:
        with self._stack(name, None, create=False) as stack:
            self._run(name, "stack rm", lambda: stack.workspace.remove_stack(name))

    def recover(self, name: str) -> None:
        """Bring a stack left by a killed process back to nothing: drop its stale lock, destroy, remove.

        A lock whose owning CLI process still runs is not stale: that raises StackLockedError.
        """
        holders = self.lock_holders(name)
        if holders:
            if any(procs.alive(pid) for pid in holders):
                raise StackLockedError(f"stack '{name}' is being changed by a running pulumi process {holders}")
            self.cancel(name)
        self.destroy(name, remove=True)

    def list_stacks(self) -> list[StackInfo]:
        """The stacks of the backend. A file backend with a damaged file (a write torn by a kill, which
        fails ``pulumi stack ls`` as a whole) lists the stacks that read; :meth:`scan_state` names the rest."""
        try:
            with self._workspace("list", None) as workspace:
                summaries = self._run("*", "stack ls", workspace.list_stacks)
        except StackOperationError:
            found = self.scan_state()
            if found is None or not found.damage:
                raise
            return [StackInfo(name, None, None, self.is_locked(name)) for name in found.readable]
        return [
            StackInfo(
                name=s.name,
                last_update=s.last_update,
                resource_count=s.resource_count,
                locked=self.is_locked(s.name),
            )
            for s in summaries
        ]

    @property
    def state_root(self) -> Path | None:
        """The folder of a ``file://`` backend (None for any other backend)."""
        return Path(self.backend_url[len("file://") :]) if self.backend_url.startswith("file://") else None

    def scan_state(self) -> filebackend.Scan | None:
        """The damaged files of a file backend, read without the CLI (None for any other backend); files
        a live ``pulumi`` process may be writing are left out (``ale_iac.filebackend``)."""
        root = self.state_root
        if root is None:
            return None
        writing = filebackend.writing_check(self.backend_url, self.lock_holders)
        return filebackend.scan(root, PROJECT, writing)

    def is_locked(self, name: str) -> bool:
        return bool(self.lock_holders(name))

    def lock_holders(self, name: str) -> list[int]:
        """PIDs of the CLI processes holding the stack's lock (file backend; others: none known). Every
        file in the stack's lock folder is a lock to the CLI, also a temp file a killed CLI left there;
        one that names no pid counts as held by pid 0 (nobody alive)."""
        root = self.state_root
        if root is None:
            return []
        pids: list[int] = []
        for lock in (root / ".pulumi" / "locks").glob(f"*/{PROJECT}/{name}/*"):
            if lock.name.endswith(".attrs"):
                continue
            try:
                pids.append(int(json.loads(lock.read_text()).get("pid", 0)))
            except (OSError, ValueError, AttributeError):
                pids.append(0)
        return pids


_TMP: Final = "tmp"
"""The folder of an operation's work dir that its CLI call gets as ``TMPDIR``."""


def _remove_work_dir(work_dir: Path, pulumi_home: Path) -> None:
    """Remove an operation's work dir and the CLI's record of the stack last selected in it."""
    shutil.rmtree(work_dir, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        workspace_settings_file(work_dir, pulumi_home).unlink()


def ensure_pulumi_home(pulumi_home: Path) -> None:
    """Make ale-iac's Pulumi home, linking :data:`SHARED_WITH_USER_HOME` to the user's (``~/.pulumi``) where the
    user has them and the home has none yet (a plugins folder the CLI made here before the user had one stays)."""
    pulumi_home.mkdir(parents=True, exist_ok=True)
    user_home = Path.home() / ".pulumi"
    for name in SHARED_WITH_USER_HOME:
        link, target = pulumi_home / name, user_home / name
        if target.exists() and not link.exists() and not link.is_symlink():
            with contextlib.suppress(FileExistsError):  # another engine linked it meanwhile
                link.symlink_to(target)


def workspace_settings_file(project_dir: Path, pulumi_home: Path) -> Path:
    """Where the Pulumi CLI records the stack selected in ``project_dir`` (by ``stack select`` or ``stack
    init``): ``<PULUMI_HOME>/workspaces/<project>-<sha1 of its Pulumi.yaml's path>-workspace.json``
    (the CLI's ``projectWorkspace.settingsPath``). Each of ale-iac's operations has a project folder of its own,
    so each such file is written once and never read again."""
    project_file = str(project_dir / "Pulumi.yaml")
    digest = hashlib.sha1(project_file.encode(), usedforsecurity=False).hexdigest()
    return pulumi_home / "workspaces" / f"{PROJECT}-{digest}-workspace.json"


def sweep_orphan_providers() -> list[int]:
    """Kill dynamic-provider processes whose owner is gone.

    Two kinds: a plugin the CLI started (``pulumi-resource-pulumi-python``, in its own process group,
    killed by the CLI when the operation ends) outlives a CLI that was killed, idle or still inside a
    ``create``; an engine's shared provider host (``ale_iac.provider_host``) exits by itself when its
    engine's process dies, and is swept here if it has not yet. Returns the pids killed.
    """
    killed: list[int] = []
    for pid in procs.all_pids():
        argv = procs.argv(pid)
        if any(a.endswith("pulumi-resource-pulumi-python") for a in argv[:2]):
            ppid = procs.parent(pid) or 0
            parent = (procs.argv(ppid) or [""])[0] if ppid > 1 else ""
            if ppid > 1 and procs.alive(ppid) and parent.rsplit("/", 1)[-1] == "pulumi":
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
                killed.append(pid)
        elif PROVIDER_HOST_MODULE in argv[1:4]:
            owner = int(argv[-1]) if argv[-1].isdigit() else 0
            if owner > 1 and procs.parent(pid) == owner and procs.alive(owner):
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)  # by pid: it shares its engine's process group
                killed.append(pid)
    return killed


def live_outputs(unit: UnitOutputs) -> UnitOutputs:
    """A unit's handle with the endpoint and token its sandbox has now.

    A pool unit of a host substrate is reset between leases by remaking it under the same id
    (``ale_iac.runner.resets``), so the same Pulumi resource, but with a new endpoint port and token (and, for
    some substrates, a new container), which the stack's outputs (written at creation) do not know. Its
    substrate says what they are now (``Substrate.current``). Other kinds, and a sandbox that is gone or was
    never reset, keep the stack's values.
    """
    substrate = registry.of_unit(unit)
    if substrate is None:
        return unit
    try:
        live = substrate.current(unit)
    except (OSError, ValueError, AleIacError):
        return unit
    if live is None:
        return unit
    update: dict[str, Any] = {"endpoint": live.endpoint, "endpoint_token": live.endpoint_token}
    if live.container_id is not None:
        update["container_id"] = live.container_id
    return unit.model_copy(update=update)


class _NoReadbackStack(auto.Stack):
    """A stack whose ``up`` does not read its outputs and history back (three CLI calls) after the update.

    ``create``: made with ``stack init``; else it exists and is used as it is (no ``stack select``: every
    CLI call names its stack with ``--stack``).
    """

    def __init__(self, name: str, workspace: auto.Workspace, create: bool) -> None:
        if create:
            super().__init__(name, workspace, StackInitMode.CREATE)
        else:
            self.name, self.workspace, self._mode = name, workspace, StackInitMode.SELECT

    def outputs(self) -> auto.OutputMap:
        return {}

    def info(self, show_secrets: bool = True) -> auto.UpdateSummary | None:
        del show_secrets  # the signature the SDK calls
        return _NOT_READ


_NOT_READ = auto.UpdateSummary(
    kind="update",
    start_time=datetime.datetime.fromtimestamp(0, tz=datetime.UTC),
    message="",
    environment={},
    config={},
    result="succeeded",
    end_time=None,
    version=None,
    deployment=None,
    resource_changes=None,
)
"""What ``up`` of a :class:`_NoReadbackStack` reports as its summary: a placeholder nobody reads."""


@contextlib.contextmanager
def _language_client(program: Program) -> Iterator[str]:
    """The SDK's in-process language runtime for ``program`` on a loopback port, for ``--client``."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(LanguageServer(program), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def _empty_program() -> None:
    """Program used for operations that do not run one (destroy, outputs, cancel)."""


def read_unit_handle(stack: str, unit: str | None = None) -> UnitOutputs:
    """The handle of one unit of a stack (the only unit when ``unit`` is None)."""
    units = Engine().units(stack)
    if unit is None:
        if len(units) != 1:
            raise AleIacError(f"stack '{stack}' has {len(units)} units ({', '.join(units)}); name one")
        return next(iter(units.values()))
    if unit not in units:
        raise AleIacError(f"stack '{stack}' has no unit '{unit}' (units: {', '.join(units) or 'none'})")
    return units[unit]
