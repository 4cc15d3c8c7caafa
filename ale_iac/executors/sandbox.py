"""The ``sandbox`` executor: the in-sandbox shape. The deployer runs inside the sandbox itself.

Everything goes through the sandbox's computer-server (the one transport every substrate has):

1. **Stage**, each at most once per sandbox (a ``.complete`` marker; a pool sandbox keeps them):
   the runtime bundle for the sandbox's Python (``executors.bundle``), and each agent CLI the
   deployer declares, carried in from this host's npm install (``ale_iac.agent_sdk.clis``) as a
   compressed archive, which the unit unpacks. The archive goes through the unit's bulk transport where it
   has one that reaches there (a qemu guest's share: a file copy on this host, instead of a hundred megabytes
   of base64 through an emulated guest's computer-server), else the endpoint's file writes. Per unit: the
   preset folder, the spec, and the unit's gateway token in a 0600 secrets file the entry deletes on reading.
2. **Start** ``python -m ale_iac.executors.entry`` detached, in a session of its own (``setsid``);
   its session id is recorded in ``_pid``.
3. **Follow** it: poll for ``_done``, and copy the work dir back into the unit's record while it
   runs (appending what files grew), so a crash or a kill still leaves the logs so far.
4. **Stop** it: the entry enforces the deadline itself (its deployer's processes die with it); if
   it overruns by :data:`GRACE_S`, or this coroutine is cancelled (the unit's own deadline, an
   interrupt), every process of its session is killed and the kill is checked, before the result
   is returned or the cancellation goes on. So whatever the cleanup mode, nothing of the agent
   runs in the sandbox once the unit moves on.

The agent reaches its model through the unit's model channel (``UnitOutputs.gateway_channel``: any unit whose
endpoint is an ale-iac forwarder, a host substrate's, a cloud VM of ale-iac's disk, a static endpoint declared
one; ``registry.require_channel``): the run's gateway serves the unit's
grant on a private Unix socket here, and for as long as the agent runs a
:class:`~ale_iac.substrates.channel.ModelChannel` carries each connection the agent makes to the channel's
in-unit URL back to that socket, over connections this host opens to the unit's endpoint. The agent sends
its per-unit token; the real API key never enters the sandbox, and neither do other secrets: a preset that
hands an agent ``secrets`` cannot run in-sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import shutil
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import ClassVar

from ale_iac.agent_sdk.config import AgentConfig, AgentRunResult, BridgeKind
from ale_iac.agent_sdk.executor import BridgeLaunch, ModelAccess, ProcessResult, Runnable
from ale_iac.contract import UnitOutputs
from ale_iac.errors import AleIacError, one_line
from ale_iac.executors import entry
from ale_iac.executors.bundle import Bundle, ensure_bundle
from ale_iac.executors.workdir import HostWorkDir
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.protocol import ComputerServerError
from ale_iac.sandbox.transport import bulk_transport
from ale_iac.substrates import registry
from ale_iac.substrates.channel import ModelChannel
from ale_iac.substrates.relay import unix_connector
from ale_iac.task import shell_quote

_q = shell_quote

GRACE_S = 20.0
"""How long past its deadline the entry may take to write its result before it is killed."""
POLL_S = 0.5
"""Interval of the ``_done`` check (a poll of a file through the computer-server)."""
SYNC_EVERY_S = 5.0
"""How often the work dir is copied back while the agent runs (hot artifacts)."""
UPLOAD_BLOCK = 32 * 1024 * 1024


class SandboxExecutor(HostWorkDir):
    kind: ClassVar[str] = "sandbox"
    native_shell: ClassVar[bool] = True

    @classmethod
    def check_preset(cls, config: AgentConfig, source: str | Path) -> None:
        entry.check_shipped_deployer(cls.kind, config, source)

    # -- where things are inside ---------------------------------------------------------------

    @property
    def _base(self) -> PurePosixPath:
        return PurePosixPath(self.sandbox.paths.work_dir_base)

    @property
    def remote_work_dir(self) -> str:
        if not hasattr(self, "_remote_work_dir"):
            name = f"{self.work_dir.parent.name or 'unit'}-{secrets.token_hex(3)}"
            self._remote_work_dir = str(self._base / self.config.name / name)
        return self._remote_work_dir

    def _cli_dir(self, name: str) -> PurePosixPath:
        install = self._cli(name)
        return self._base / ".clis" / f"{install.name}-{install.version}"

    def bridge_launch(self, kind: BridgeKind) -> BridgeLaunch:
        """The bridge as the deployer starts it inside: stdio, over the server's own loopback."""
        python, pythonpath = self._python()
        return BridgeLaunch(
            command=python,
            args=["-m", "ale_iac.bridges", kind, "--endpoint", self.sandbox.inner_endpoint],
            env={"PYTHONPATH": pythonpath, "PATH": "/usr/local/bin:/usr/bin:/bin"},
        )

    def model_access(self) -> ModelAccess:
        why = "an in-sandbox agent reaches its model through it; run the agent with executor: docker or local"
        channel = registry.require_channel(self.sandbox, why)
        return self._grant().access(channel.sandbox_url)

    def cli(self, name: str) -> str:
        return str(self._cli_dir(name) / self._cli(name).entry)

    def _python(self) -> tuple[str, str]:
        bundle = getattr(self, "_bundle", None)
        if bundle is None:
            raise AleIacError("the runtime bundle is not staged yet (bridge() is for the deployer inside)")
        root = self._base / ".runtime"
        return self.sandbox.paths.python, f"{root / bundle.src.name}:{root / bundle.deps.name}"

    # -- the run -------------------------------------------------------------------------------

    async def run_deployer(self, deployer: Runnable, prompt: str, timeout_s: float) -> AgentRunResult:
        if self.sandbox.os != "linux":
            raise AleIacError(f"the sandbox executor runs on Linux sandboxes only (this one is {self.sandbox.os})")
        if self.env:
            raise AleIacError(
                f"agent {self.config.name} lists secrets ({', '.join(sorted(self.env))}); secrets never enter a "
                "sandbox: use the model gateway (model.api_key_secret) or run it with executor: docker or local"
            )
        async with self.sandbox.client(timeout=300.0) as client, contextlib.AsyncExitStack() as stack:
            await self._stage(client)
            model = await stack.enter_async_context(self._model_channel()) if self.model_grant else None
            await self._start(client, prompt, timeout_s, model)
            try:
                return await self._follow(client, timeout_s)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._kill(client))
                raise

    @contextlib.asynccontextmanager
    async def _model_channel(self) -> AsyncIterator[ModelAccess]:
        """The unit's model channel, open while the agent runs: the grant served on a private socket here,
        carried into the unit through its endpoint; closed on the way out and when the grant is revoked."""
        grant = self.model_grant
        assert grant is not None
        access = self.model_access()
        token = self.sandbox.token()
        if token is None:
            raise AleIacError(f"sandbox {self.sandbox.resource_id} has no endpoint token: no model channel without it")
        folder = Path(tempfile.mkdtemp(prefix="ale-iac-channel-"))
        try:
            socket_path = folder / "gateway.sock"
            await asyncio.to_thread(grant.attach_unix, socket_path)
            channel = ModelChannel(self.sandbox.endpoint, token, unix_connector(str(socket_path)))
            await channel.open()
            try:
                if grant.on_revoke is not None:
                    grant.on_revoke(lambda: channel.close_soon("the unit's model grant was revoked"))
                yield access
            finally:
                await channel.aclose()
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)

    async def _stage(self, client: ComputerServerClient) -> None:
        probe = await client.run_command(
            f"{shell_quote(self.sandbox.paths.python)} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'"
        )
        version = probe.stdout.strip()
        if probe.exit_code != 0 or not version:
            raise AleIacError(f"no usable Python at {self.sandbox.paths.python} in the sandbox: {probe.stderr.strip()}")
        self._bundle: Bundle = await asyncio.to_thread(ensure_bundle, version)
        runtime = self._base / ".runtime"
        for folder in (self._bundle.deps, self._bundle.src):
            await ship_folder(client, folder, str(runtime / folder.name), unit=self.sandbox)
        for name, install in self.clis.items():
            from ale_iac.agent_sdk.clis import archive

            cli_archive = await asyncio.to_thread(archive, install)
            await ship_archive(client, cli_archive, str(self._cli_dir(name)), self.sandbox)
        work = self.remote_work_dir
        await _check(client, f"mkdir -p {shell_quote(work)} && chmod 700 {shell_quote(work)}")
        if self.config.source_dir:
            await ship_folder(client, Path(self.config.source_dir), f"{work}/{entry.PRESET_DIR}", cache=False)

    async def _start(
        self, client: ComputerServerClient, prompt: str, timeout_s: float, model: ModelAccess | None
    ) -> None:
        work = self.remote_work_dir
        python, pythonpath = self._python()
        bridges: dict[BridgeKind, BridgeLaunch] = {"cua": self.bridge("cua"), "vm": self.bridge("vm")}
        spec = entry.build_spec(
            config=self.config,
            preset_dir=f"{work}/{entry.PRESET_DIR}",
            kind=self.kind,
            sandbox=self.sandbox.model_copy(update={"endpoint": self.sandbox.inner_endpoint, "endpoint_token": None}),
            work_dir=work,
            task=self.task,
            model=model,
            clis={name: self.cli(name) for name in self.clis},
            bridges=bridges,
            secret_env=[],
            prompt=prompt,
            timeout_s=timeout_s,
        )
        await client.write_text(f"{work}/{entry.SPEC_FILE}", json.dumps(spec, indent=2))
        if self.model_grant is not None:
            secrets_path = f"{work}/{entry.SECRETS_FILE}"
            await _check(client, f"umask 077 && : > {shell_quote(secrets_path)}")
            await client.write_text(secrets_path, json.dumps({entry.MODEL_TOKEN_SECRET: self.model_grant.token}))
        launch = (
            f"cd {shell_quote(work)} && PYTHONPATH={shell_quote(pythonpath)} setsid sh -c "
            + shell_quote(
                f"echo $$ > {entry.PID_FILE}; exec {shell_quote(python)} -m ale_iac.executors.entry {entry.SPEC_FILE}"
            )
            + f" > {entry.ENTRY_LOG} 2>&1 < /dev/null &"
        )
        await _check(client, launch)
        self._session: int | None = None
        self._started = time.monotonic()

    async def _session_id(self, client: ComputerServerClient) -> int | None:
        if getattr(self, "_session", None) is None:
            text = await client.run_command(f"cat {shell_quote(self.remote_work_dir)}/{entry.PID_FILE} 2>/dev/null")
            if text.stdout.strip().isdigit():
                self._session = int(text.stdout.strip())
        return self._session

    async def _follow(self, client: ComputerServerClient, timeout_s: float) -> AgentRunResult:
        work = self.remote_work_dir
        deadline = self._started + timeout_s + GRACE_S
        last_sync = 0.0
        mirror = _Mirror(self.work_dir)
        while True:
            done = await client.file_exists(f"{work}/{entry.DONE_FILE}")
            now = time.monotonic()
            if done:
                break
            if now >= deadline:
                await self._kill(client)
                await mirror.sync(client, work)
                return AgentRunResult(
                    status="timeout",
                    error=f"the in-sandbox agent overran its {timeout_s:.0f} s limit by {GRACE_S:.0f} s and was killed",
                    duration_s=now - self._started,
                )
            if not await self._alive(client) and not await client.file_exists(f"{work}/{entry.DONE_FILE}"):
                await mirror.sync(client, work)
                return AgentRunResult(
                    status="failed",
                    error="the in-sandbox agent's entry died without a result (see agent/_entry.log)",
                    duration_s=now - self._started,
                )
            if now - last_sync >= SYNC_EVERY_S:
                await mirror.sync(client, work)
                last_sync = now
            await asyncio.sleep(POLL_S)
        await self._kill(client)  # whatever the deployer left running (it should have left nothing)
        await mirror.sync(client, work)
        self._scrub_mirror()
        try:
            return AgentRunResult.model_validate_json((self.work_dir / entry.RESULT_FILE).read_text())
        except (OSError, ValueError) as exc:
            return AgentRunResult(status="failed", error=f"unreadable {entry.RESULT_FILE}: {one_line(exc)}")

    async def _alive(self, client: ComputerServerClient) -> bool:
        session = await self._session_id(client)
        if session is None:
            return time.monotonic() - self._started < 30.0  # not yet written: give it a moment
        probe = await client.run_command(f"pgrep -s {session} >/dev/null")
        return probe.exit_code == 0

    async def _kill(self, client: ComputerServerClient) -> None:
        """SIGKILL every process of the entry's session, until none is left (checked)."""
        session = await self._session_id(client)
        if session is None:
            return
        result = await client.run_command(
            f"for i in $(seq 50); do pkill -KILL -s {session} || exit 0; sleep 0.1; done; "
            f"pgrep -s {session} >/dev/null && exit 1 || exit 0"
        )
        if result.exit_code != 0:
            raise AleIacError(f"processes of the agent's session {session} survive SIGKILL in the sandbox")
        await client.run_command(f"rm -f {shell_quote(self.remote_work_dir)}/{entry.SECRETS_FILE}")

    def _scrub_mirror(self) -> None:
        """The gateway token is not a key, but no record keeps it either."""
        token = self.model_grant.token if self.model_grant else None
        for path in self.work_dir.rglob("*"):
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
            clean = data
            if token:
                clean = clean.replace(token.encode(), b"**********")
            text = clean.decode("utf-8", errors="surrogateescape")
            redacted = self.redact(text)
            if redacted != text:
                clean = redacted.encode("utf-8", errors="surrogateescape")
            if clean != data:
                path.write_bytes(clean)

    # -- the rest of the executor API (the host side's view: the mirror) -------------------------

    async def run(
        self,
        argv: Sequence[str],
        *,
        log_name: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> ProcessResult:
        """Run a command in the sandbox, waiting for it (its output is kept as ``log_name``)."""
        exports = "".join(f"export {k}={shell_quote(v)}; " for k, v in (env or {}).items())
        command = exports + " ".join(shell_quote(a) for a in argv)
        start = time.monotonic()
        async with self.sandbox.client() as client:
            result = await client.run_command(command, timeout=timeout_s)
        self.write_text(log_name, result.stdout + result.stderr)
        return ProcessResult(
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            duration_s=time.monotonic() - start,
            log_path=str(self.work_dir / log_name),
        )


async def _check(client: ComputerServerClient, command: str) -> None:
    result = await client.run_command(command)
    if result.exit_code != 0:
        raise AleIacError(
            f"in the sandbox, `{command[:120]}` failed ({result.exit_code}): {result.stderr.strip()[:400]}"
        )


def folder_archive(folder: Path) -> Path:
    """A cached ``.tar.gz`` of a cache folder (its name is its identity), made once."""
    target = folder.with_name(folder.name + ".tar.gz")
    if not target.exists():
        tmp = target.with_name(target.name + f".{secrets.token_hex(4)}.tmp")
        with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
            tar.add(folder, arcname=".", filter=_no_pycache)
        tmp.rename(target)
    return target


def _no_pycache(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name.split("/") else info


async def ship_folder(
    client: ComputerServerClient,
    folder: Path,
    remote: str,
    *,
    cache: bool = True,
    unit: UnitOutputs | None = None,
) -> None:
    """Copy a host folder to ``remote`` in the sandbox as one archive; with ``cache``, only if it is
    not there yet (the folder's name is its content's identity)."""
    if cache:
        await ship_archive(client, await asyncio.to_thread(folder_archive, folder), remote, unit)
        return
    data = await asyncio.to_thread(_tar_gz, folder)
    part = f"{remote}.{secrets.token_hex(4)}.tar.gz"
    await client.write_bytes(part, data)
    await _check(client, f"mkdir -p {_q(remote)} && tar -xzf {_q(part)} -C {_q(remote)} && rm -f {_q(part)}")


def _tar_gz(folder: Path) -> bytes:
    import io

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        tar.add(folder, arcname=".", filter=_no_pycache)
    return buffer.getvalue()


async def ship_archive(
    client: ComputerServerClient, archive: Path, remote: str, unit: UnitOutputs | None = None
) -> None:
    """Unpack a host ``.tar.gz`` at ``remote`` in the sandbox, unless an earlier copy completed there. The
    archive itself goes through ``unit``'s bulk transport when it has one that reaches there."""
    if await client.file_exists(f"{remote}/.complete"):
        return
    await _check(client, f"mkdir -p {shell_quote(str(PurePosixPath(remote).parent))}")
    drop = f"{remote}.{secrets.token_hex(4)}.in"
    transport = bulk_transport(unit, drop) if unit is not None else None
    if unit is not None and transport is not None:
        part = f"{drop}/{archive.name}"
        with tempfile.TemporaryDirectory(prefix=".ship-", dir=archive.parent) as folder:
            await asyncio.to_thread(_link_or_copy, archive, Path(folder) / archive.name)
            await transport.upload(unit, client, Path(folder), drop)
    else:
        part = f"{drop}/archive.tar.gz"
        await _check(client, f"mkdir -p {_q(drop)}")
        with archive.open("rb") as source:
            first = True
            while block := await asyncio.to_thread(source.read, UPLOAD_BLOCK):
                await client.write_bytes(part, block, append=not first)
                first = False
    tmp = f"{remote}.{secrets.token_hex(4)}.tmp"
    await _check(
        client,
        f"mkdir -p {_q(tmp)} && tar -xzf {_q(part)} -C {_q(tmp)} && rm -rf {_q(drop)} && touch {_q(tmp)}/.complete"
        f" && rm -rf {_q(remote)} && mv {_q(tmp)} {_q(remote)}",
    )


def _link_or_copy(source: Path, dest: Path) -> None:
    """A hard link where both are on one file system (the archive is never written again), else a copy."""
    try:
        dest.hardlink_to(source)
    except OSError:
        shutil.copyfile(source, dest)


class _Mirror:
    """The remote work dir copied into the host's, incrementally: files that grew get their new
    bytes appended, others are copied whole. The entry's private files and the preset stay out."""

    def __init__(self, local: Path) -> None:
        self.local = local.resolve()
        self.sizes: dict[str, int] = {}

    async def sync(self, client: ComputerServerClient, remote: str) -> None:
        for rel, size in await _remote_files(client, remote):
            dest = self._destination(rel)
            if dest is not None and self.sizes.get(rel) != size:
                await self._copy(client, f"{remote}/{rel}", rel, size, dest)

    def _destination(self, rel: str) -> Path | None:
        """Where a remote file goes in the host's work dir; None for a path that would leave it (the listing
        comes from the sandbox: never write outside the work dir)."""
        parts = PurePosixPath(rel).parts
        if rel.startswith("/") or ".." in parts:
            return None
        dest = self.local.joinpath(*parts)
        return dest if dest.parent.resolve().is_relative_to(self.local) else None

    async def _copy(self, client: ComputerServerClient, source: str, rel: str, size: int, dest: Path) -> None:
        """The file's new bytes appended when it grew, else the whole file."""
        had = self.sizes.get(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_symlink():
            dest.unlink()
        appending = had is not None and size > had and dest.exists()
        try:
            if appending:
                data = await client.read_bytes(source, offset=had or 0, length=size - (had or 0))
            else:
                data = await client.read_bytes(source, length=size)
        except ComputerServerError:
            if await client.file_exists(source):
                raise
            # Gone since the listing (an agent's temp file, a SQLite -shm/-wal): the next sync
            # copies it whole if it comes back.
            self.sizes.pop(rel, None)
            return
        if appending:
            with dest.open("ab") as out:
                out.write(data)
        else:
            dest.write_bytes(data)
        self.sizes[rel] = size


async def _remote_files(client: ComputerServerClient, remote: str) -> list[tuple[str, int]]:
    """(relative path, size) of each file of the remote work dir, but the entry's private files and the preset."""
    listing = await client.run_command(
        f"cd {shell_quote(remote)} 2>/dev/null && find . -path ./{entry.PRESET_DIR} -prune -o -type f "
        r"-printf '%s\t%P\0' | base64 -w0"
    )
    if listing.exit_code != 0 or not listing.stdout.strip():
        return []
    files: list[tuple[str, int]] = []
    for item in base64.b64decode(listing.stdout.strip()).decode(errors="replace").split("\0"):
        size_text, _, rel = item.partition("\t")
        if rel and size_text.isdigit() and rel not in entry.PRIVATE_FILES - {entry.RESULT_FILE}:
            files.append((rel, int(size_text)))
    return files
