"""The ``docker`` executor: the out-of-sandbox shape, walled off from the host.

The deployer runs inside a container of the desktop image (``images.ensure_docker_image``), with the
image's own Python and the runtime bundle (``executors.bundle``), through the entry
(``python3 -m ale_iac.executors.entry /work/_spec.json``). What the container sees of the host:

* ``/work``: the unit's work dir (the record's ``agent/`` folder), read-write, the only writable host path;
* ``/opt/ale-iac/runtime/{src,site}``: the bundle, read-only (``PYTHONPATH``);
* ``/opt/ale-iac/preset``: the agent's preset folder (its deployer), read-only;
* ``/opt/ale-iac/clis/<name>``: each agent CLI the deployer declared, read-only;
* ``/run/ale-iac``: a private host folder (0700, on tmpfs where the host has ``/dev/shm``) holding
  ``gateway.sock`` (the run's model gateway serves it) and ``sandbox.sock`` (a byte relay this
  executor runs to the sandbox's computer-server). The entry serves ``127.0.0.1:4001`` and ``:4002``
  inside, leading to them.

``--network none``: nothing else is reachable; the relays are the only ways out, and what they lead to
checks a token (the gateway its per-unit token, the computer-server its bearer token).

Secrets (the agent's ``env``, the gateway token, the endpoint token) never go on a command line, in an
image, in the work dir or in the container's configuration: ``docker run --env-file`` would put them in
``Config.Env``, which ``docker inspect`` shows and the engine stores on disk. They travel in
``/run/ale-iac/secrets.json`` (0600, on the host's tmpfs), which the entry reads and deletes at once
(the spec's ``secrets_file``). The host deletes the folder in ``finally`` whatever happened.

Hardening: every capability dropped, ``no-new-privileges``, a read-only root file system (tmpfs for
``/tmp`` and ``/root``, the home the agent CLIs write their state to), memory and pid limits, an init
(tini) as PID 1. The agent runs as root *inside* (uid 0 without any capability, in the engine's default
seccomp profile): it owns what it writes into ``/work`` like the runner, and root is what reaches the
0700 socket folder; there is no user namespace, so it is the host's uid 0 confined by the above.

Deadlines: the container is killed (SIGKILL by the engine) and removed when ``timeout_s`` (plus a short
grace for the entry's own deadline to report first) has passed, and also when the coroutine is
cancelled: the container is gone before ``run_deployer`` returns or raises. Every container carries
``ale-iac.*`` labels (home, run, unit, agent, the runner's pid and its start time) so that ``ale-iac gc``
removes what a killed runner left (``containers_of_this_home``, ``runner/gc.py``).

The engine is ale-iac's own (``runtime.engine_url``: ``scripts/dockerd.sh``, with ``userns-remap``), and the
container opts out of its remap (``userns_mode="host"``): the bind mounts name this host's paths, root's 0700
folders among them. Nothing is ever pulled: the image is imported from the built rootfs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from ale_iac import docker_engine, images, procs
from ale_iac.agent_sdk.config import AgentConfig, AgentRunResult, BridgeKind
from ale_iac.agent_sdk.executor import BridgeLaunch, ModelAccess, ProcessResult, Runnable
from ale_iac.contract import ENDPOINT_TOKEN_ENV, UnitOutputs
from ale_iac.errors import AleIacError
from ale_iac.executors.bundle import ensure_bundle
from ale_iac.executors.entry import (
    DONE_FILE,
    MODEL_TOKEN_SECRET,
    RESULT_FILE,
    SPEC_FILE,
    build_spec,
    check_shipped_deployer,
)
from ale_iac.executors.workdir import HostWorkDir
from ale_iac.paths import home_id
from ale_iac.substrates.relay import serve_relay

if TYPE_CHECKING:
    from docker import DockerClient


log = logging.getLogger(__name__)
T = TypeVar("T")

IMAGE = "desktop"
PYTHON = "/usr/bin/python3"
WORK = "/work"
RUNTIME = "/opt/ale-iac/runtime"
PRESET = "/opt/ale-iac/preset"
CLIS = "/opt/ale-iac/clis"
SOCKETS = "/run/ale-iac"
GATEWAY_SOCKET = "gateway.sock"
SANDBOX_SOCKET = "sandbox.sock"
SECRETS = "secrets.json"
GATEWAY_PORT = 4001
SANDBOX_PORT = 4002
HOME = "/root"
CONTAINER_LOG = "container.log"
PYTHONPATH = f"{RUNTIME}/src:{RUNTIME}/site"
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

LABEL = images.DOCKER_LABEL_PREFIX
LABEL_HOME = f"{LABEL}home"
LABEL_RUN = f"{LABEL}run"
LABEL_UNIT = f"{LABEL}unit"
LABEL_AGENT = f"{LABEL}agent"
LABEL_OWNER_PID = f"{LABEL}owner-pid"
LABEL_OWNER_START = f"{LABEL}owner-start"

MEMORY_LIMIT = "4g"
PIDS_LIMIT = 1024
TMPFS = {
    "/tmp": "rw,exec,nosuid,nodev,size=2g,mode=1777",
    HOME: "rw,exec,nosuid,nodev,size=1g,mode=0700",
}
KILL_GRACE_S = 5.0
"""The entry inside keeps the same deadline and reports a timeout with the agent's logs; the engine
kills the container this much later if it has not exited by then (an install that hangs, say)."""
LOG_TAIL_LINES = 30


# Runs first in the container: the secrets file into the environment, the file deleted, then the entry.
def _private_tmp() -> str | None:
    """Where the socket folder goes: memory-backed ``/dev/shm`` if the host has it (the secrets file
    never reaches a disk), else the default temp dir."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


async def _create_and_start(run: _Run, tag: str, options: dict[str, Any]) -> None:
    """Create the container from ``tag`` and start it; its id is in ``run`` as soon as it exists, so cleanup
    removes it even when the creation is cancelled half-way."""
    from docker.errors import DockerException

    create = asyncio.ensure_future(asyncio.to_thread(run.client.containers.create, tag, **options))
    try:
        try:
            container = await asyncio.shield(create)
        except asyncio.CancelledError:
            # Cancelled while the engine was creating it: it may exist already; cleanup removes it.
            with contextlib.suppress(Exception):
                run.container_id = (await create).id
            raise
        run.container_id = container.id
        await asyncio.to_thread(container.start)
    except DockerException as exc:
        raise AleIacError(f"cannot start the agent's container from {tag}: {exc}") from None


def _in_thread(fn: Callable[[], T], name: str) -> asyncio.Future[T]:
    """``fn`` in a thread of its own (not the loop's shared pool, which a long wait would hold)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value: Any = fn()
            exc: BaseException | None = None
        except BaseException as error:
            value, exc = None, error
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


async def _uncancellable(aw: Awaitable[None]) -> None:
    """Await ``aw`` to its end even if the caller is cancelled meanwhile; then re-raise the cancel."""
    task = asyncio.ensure_future(aw)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    task.result()


def _tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


@dataclass
class _Run:
    """One container's life: what cleanup needs to undo."""

    client: DockerClient
    sockdir: Path
    container_id: str | None = None
    relay: asyncio.Task[None] | None = None
    listener: socket.socket | None = None
    log_text: str | None = None


class DockerExecutor(HostWorkDir):
    """Host side of the ``docker`` executor: ``run_deployer`` runs the deployer in a container; the
    file methods act on the work dir (the container's ``/work``), for ``parse_artifacts``; ``bridge``,
    ``model_access`` and ``cli`` say what the deployer sees inside."""

    kind: ClassVar[str] = "docker"
    native_shell: ClassVar[bool] = False

    @classmethod
    def check_preset(cls, config: AgentConfig, source: str | Path) -> None:
        check_shipped_deployer(cls.kind, config, source)

    # -- what the deployer sees inside -------------------------------------------------------------

    def sandbox_url(self) -> str:
        """The computer-server from inside the container: the entry's relay to ``sandbox.sock``."""
        scheme = urlsplit(self.sandbox.endpoint).scheme or "http"
        return f"{scheme}://127.0.0.1:{SANDBOX_PORT}"

    def bridge_launch(self, kind: BridgeKind) -> BridgeLaunch:
        """The bridge inside, over the sandbox relay. The endpoint token is not here (it is a secret):
        the entry adds ``ALE_IAC_ENDPOINT_TOKEN`` from the secrets it received."""
        env = {"PATH": CONTAINER_PATH, "PYTHONPATH": PYTHONPATH, "HOME": HOME, "LANG": "C.UTF-8"}
        return BridgeLaunch(
            command=PYTHON, args=["-m", "ale_iac.bridges", kind, "--endpoint", self.sandbox_url()], env=env
        )

    def model_access(self) -> ModelAccess:
        return self._grant().access(f"http://127.0.0.1:{GATEWAY_PORT}")

    def cli(self, name: str) -> str:
        install = self._cli(name)
        return f"{CLIS}/{name}/{install.entry}"

    def _preset_dir(self) -> str:
        return PRESET if self.config.source_dir else ""

    def _secret_values(self) -> dict[str, str]:
        values = dict(self.env)
        token = self.sandbox.token()
        if token:
            values[ENDPOINT_TOKEN_ENV] = token
        if self.model_grant is not None:
            values[MODEL_TOKEN_SECRET] = self.model_grant.token
        return values

    def spec(self, prompt: str, timeout_s: float) -> dict[str, Any]:
        """The entry's spec (no secrets in it: their names only)."""
        fields = self.sandbox.model_dump(exclude={"stack"})
        inside = UnitOutputs.model_validate({**fields, "endpoint": self.sandbox_url(), "endpoint_token": None})
        relays = [{"listen_port": SANDBOX_PORT, "unix": f"{SOCKETS}/{SANDBOX_SOCKET}"}]
        if self.model_grant is not None:
            relays.insert(0, {"listen_port": GATEWAY_PORT, "unix": f"{SOCKETS}/{GATEWAY_SOCKET}"})
        return build_spec(
            config=self.config,
            preset_dir=self._preset_dir(),
            kind=self.kind,
            sandbox=inside,
            work_dir=WORK,
            task=self.task,
            model=self.model_access() if self.model_grant is not None else None,
            clis={name: self.cli(name) for name in self.clis},
            bridges={kind: self.bridge(kind) for kind in ("vm", "cua")},
            secret_env=[],
            prompt=prompt,
            timeout_s=timeout_s,
            relays=relays,
            secrets_file=f"{SOCKETS}/{SECRETS}",
            private_dir=SOCKETS,
        )

    # -- the container -----------------------------------------------------------------------------

    def labels(self) -> dict[str, str]:
        pid = os.getpid()
        return {
            LABEL_HOME: home_id(),
            LABEL_RUN: self.sandbox.labels.get("run", ""),
            LABEL_UNIT: self.sandbox.labels.get("unit") or self.sandbox.unit,
            LABEL_AGENT: self.config.name,
            LABEL_OWNER_PID: str(pid),
            LABEL_OWNER_START: repr(procs.start_time(pid)),
        }

    def _mounts(self, bundle_src: Path, bundle_deps: Path, sockdir: Path) -> list[Any]:
        from docker.types import Mount

        def bind(source: Path | str, target: str, read_only: bool = True) -> Mount:
            return Mount(target=target, source=str(Path(source).resolve()), type="bind", read_only=read_only)

        mounts = [
            bind(self.work_dir, WORK, read_only=False),
            bind(bundle_src, f"{RUNTIME}/src"),
            bind(bundle_deps, f"{RUNTIME}/site"),
            bind(sockdir, SOCKETS, read_only=False),  # the entry deletes the secrets file in it
        ]
        if self.config.source_dir:
            mounts.append(bind(self.config.source_dir, PRESET))
        mounts += [bind(install.root, f"{CLIS}/{name}") for name, install in self.clis.items()]
        return mounts

    async def run_deployer(self, deployer: Runnable, prompt: str, timeout_s: float) -> AgentRunResult:
        """Run the deployer's ``install`` and ``launch`` in a fresh container within ``timeout_s``."""
        del deployer  # it runs inside, rebuilt by the entry from the spec
        image = await asyncio.to_thread(images.require_image, IMAGE)
        tag = await asyncio.to_thread(images.ensure_docker_image, IMAGE, log.info)
        bundle = await asyncio.to_thread(ensure_bundle, _python_version(image.rootfs), log.info)
        client = await asyncio.to_thread(docker_engine.client)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        run = _Run(client=client, sockdir=Path(tempfile.mkdtemp(prefix="ale-iac-docker-", dir=_private_tmp())))
        try:
            return await self._run_container(run, tag, bundle.src, bundle.deps, prompt, timeout_s)
        finally:
            await _uncancellable(self._cleanup(run))

    async def _run_container(
        self, run: _Run, tag: str, bundle_src: Path, bundle_deps: Path, prompt: str, timeout_s: float
    ) -> AgentRunResult:

        for stale in (RESULT_FILE, DONE_FILE):
            (self.work_dir / stale).unlink(missing_ok=True)
        if self.model_grant is not None:
            self.model_grant.attach_unix(run.sockdir / GATEWAY_SOCKET)
        run.relay = asyncio.create_task(self._sandbox_relay(run))
        _write_private(run.sockdir / SECRETS, json.dumps(self._secret_values()))
        spec = self.spec(prompt, timeout_s)
        (self.work_dir / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")

        name = f"ale-iac-{home_id()}-{secrets.token_hex(4)}"
        options = self._container_options(name, bundle_src, bundle_deps, run.sockdir)
        started = time.monotonic()
        await _create_and_start(run, tag, options)
        log.info("container %s started in %.2f s", name, time.monotonic() - started)
        deadline = timeout_s + KILL_GRACE_S
        cid = run.container_id
        assert cid is not None
        exited = _in_thread(lambda: _wait(cid, deadline + 120), name=f"wait-{name}")
        try:
            async with asyncio.timeout(deadline):  # not wait_for: it can drop a cancel (gh-86296)
                code: int | None = await asyncio.shield(exited)
        except TimeoutError:
            code = None
        return await self._outcome(run, code, timeout_s, time.monotonic() - started)

    def _container_options(self, name: str, bundle_src: Path, bundle_deps: Path, sockdir: Path) -> dict[str, Any]:
        """The agent's container: no network, read-only, every capability dropped, bounded memory and tasks;
        the deployer bundle, the work folder and the socket folder mounted (``_mounts``)."""
        return {
            "command": [PYTHON, "-m", "ale_iac.executors.entry", f"{WORK}/{SPEC_FILE}"],
            "name": name,
            "labels": self.labels(),
            "environment": {
                "HOME": HOME,
                "PATH": CONTAINER_PATH,
                "PYTHONPATH": PYTHONPATH,
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1",
                "TMPDIR": "/tmp",
            },
            "working_dir": WORK,
            "hostname": "agent",
            "network_mode": "none",
            "userns_mode": "host",  # as before ale-iac's engine remapped: it binds host folders 0700
            "mounts": self._mounts(bundle_src, bundle_deps, sockdir),
            "tmpfs": TMPFS,
            "read_only": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "mem_limit": MEMORY_LIMIT,
            "memswap_limit": MEMORY_LIMIT,
            "pids_limit": PIDS_LIMIT,
            "init": True,
        }

    async def _outcome(self, run: _Run, code: int | None, timeout_s: float, duration: float) -> AgentRunResult:
        """The run's result: a timeout (the container killed), the result the deployer wrote, or a failure
        with the tail of the container's log."""
        if code is None:
            await asyncio.to_thread(self._kill, run)
            return AgentRunResult(
                status="timeout",
                error=f"agent exceeded its {timeout_s:.0f} s limit (container killed)",
                duration_s=duration,
            )
        await asyncio.to_thread(self._save_log, run)
        result = self._read_result()
        if result is not None:
            return result
        return AgentRunResult(
            status="failed",
            exit_code=code,
            error=f"the agent's container exited with code {code} and no result; "
            f"last lines of {CONTAINER_LOG}:\n{_tail(run.log_text or '')}",
            duration_s=duration,
            logs=[CONTAINER_LOG],
        )

    def _read_result(self) -> AgentRunResult | None:
        if not (self.work_dir / DONE_FILE).exists():
            return None
        try:
            return AgentRunResult.model_validate_json((self.work_dir / RESULT_FILE).read_text())
        except (OSError, ValueError):
            return None

    def _sandbox_relay(self, run: _Run) -> Coroutine[Any, Any, None]:
        """``sandbox.sock`` -> the sandbox's computer-server (TCP), byte for byte, while the returned
        coroutine runs. The socket listens from this call on (connections wait in its backlog)."""
        where = urlsplit(self.sandbox.endpoint)
        host = where.hostname or "127.0.0.1"
        port = where.port or (443 if where.scheme == "https" else 80)
        listener = run.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(run.sockdir / SANDBOX_SOCKET))
        listener.listen(64)
        listener.setblocking(False)

        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await asyncio.open_connection(host, port)

        return serve_relay(listener, connect)

    def _kill(self, run: _Run) -> None:
        """SIGKILL through the engine (if it still runs), then keep its log."""
        from docker.errors import APIError, NotFound

        if run.container_id is None:
            return
        with contextlib.suppress(NotFound, APIError):  # APIError 409: it is not running any more
            run.client.api.kill(run.container_id, signal="SIGKILL")
        self._save_log(run)

    def _save_log(self, run: _Run) -> None:
        from docker.errors import DockerException

        if run.container_id is None or run.log_text is not None:
            return
        try:
            raw = run.client.api.logs(run.container_id, stdout=True, stderr=True, timestamps=False)
        except DockerException as exc:
            raw = f"(the container's log could not be read: {exc})\n".encode()
        run.log_text = self.redact(raw.decode(errors="replace"))
        (self.work_dir / CONTAINER_LOG).write_text(run.log_text)

    def _remove(self, run: _Run) -> None:
        from docker.errors import NotFound

        if run.container_id is None:
            return
        self._kill(run)
        with contextlib.suppress(NotFound):
            run.client.api.remove_container(run.container_id, force=True, v=True)

    async def _cleanup(self, run: _Run) -> None:
        try:
            await asyncio.to_thread(self._remove, run)
        finally:
            if run.relay is not None:
                run.relay.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await run.relay
            if run.listener is not None:
                run.listener.close()
            shutil.rmtree(run.sockdir, ignore_errors=True)
            run.client.close()

    # -- the host side of the work dir -------------------------------------------------------------

    async def run(
        self,
        argv: Sequence[str],
        *,
        log_name: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> ProcessResult:
        raise AleIacError("the docker executor runs processes only inside the agent's container (through run_deployer)")


def _wait(container_id: str, timeout_s: float) -> int:
    """The container's exit code, once it has exited (or is gone: the engine answers then too). A
    client of its own: a connection blocked in this wait is not shared with anything else."""
    client = docker_engine.client(timeout=timeout_s)
    try:
        answer = client.api.wait(container_id)
    finally:
        client.close()
    return int(answer.get("StatusCode", -1))


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _python_version(rootfs: Path) -> str:
    """``3.13`` for an image whose ``/usr/bin/python3`` is ``python3.13`` (the bundle must match it)."""
    target = os.readlink(rootfs / "usr/bin/python3") if (rootfs / "usr/bin/python3").is_symlink() else ""
    version = Path(target).name.removeprefix("python")
    if version.count(".") != 1 or not version.replace(".", "").isdigit():
        raise AleIacError(f"cannot tell the Python version of the image at {rootfs} (/usr/bin/python3 -> {target!r})")
    return version


# -- what a killed runner leaves: for `ale-iac gc` ---------------------------------------------------


@dataclass(frozen=True)
class LeftContainer:
    name: str
    id: str
    run: str
    unit: str
    owner_pid: int
    owner_start: float | None

    @property
    def owner_alive(self) -> bool:
        return procs.is_running(self.owner_pid, self.owner_start)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def containers_of_this_home(client: DockerClient) -> list[LeftContainer]:
    """Every container (running or not) this ale-iac home's docker executors made: those that record their
    runner (the substrates' containers carry this home's label too, but no runner)."""
    found = []
    mine: dict[str, str | list[str] | bool] = {"label": [f"{LABEL_HOME}={home_id()}", LABEL_OWNER_PID]}
    for container in client.containers.list(all=True, filters=mine):
        labels = container.labels
        found.append(
            LeftContainer(
                name=container.name or "",
                id=container.id or "",
                run=labels.get(LABEL_RUN, ""),
                unit=labels.get(LABEL_UNIT, ""),
                owner_pid=int(labels.get(LABEL_OWNER_PID, "0") or 0),
                owner_start=_float(labels.get(LABEL_OWNER_START, "")),
            )
        )
    return found


def remove_container(client: DockerClient, container_id: str) -> None:
    """Kill (SIGKILL) and remove a container; one already gone is fine."""
    from docker.errors import NotFound

    with contextlib.suppress(NotFound):
        client.api.remove_container(container_id, force=True, v=True)
