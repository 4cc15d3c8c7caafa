"""Where a deployer runs away from this host: ``python -m ale_iac.executors.entry SPEC.json``.

The ``sandbox`` executor starts it inside the sandbox, the ``docker`` executor inside the agent's
container, each with the runtime bundle (``executors.bundle``) on ``PYTHONPATH`` and the image's
own Python. It builds an executor of the same kind that does its I/O right there (an in-place
:class:`LocalExecutor`: processes, files, the MCP bridges over stdio), loads the deployer from the
preset folder shipped beside it, runs ``install`` and ``launch`` within the deadline, and leaves in
the work dir:

* ``_result.json``: the :class:`AgentRunResult` (or, if the entry itself failed, a failed one with
  the traceback in ``_entry.log``);
* ``_done``: written last; its presence says the result is final.

Secrets arrive in a JSON file (``secrets_file`` in the spec, by default ``_secrets.json`` in the
work dir), read and deleted at once, or in the environment by the names the spec lists; they never
sit in the spec. Two of them are the entry's own, never in the agent's environment: the unit's
gateway token (``MODEL_TOKEN_SECRET``, handed out as the agent's API key by ``model_access``) and the
sandbox endpoint's token (``ALE_IAC_ENDPOINT_TOKEN``, in a private file only the bridges are told of).
``relays`` in the spec are loopback ports to serve inside, each leading to a Unix socket (the
``docker`` executor's way to the gateway and the sandbox from a container without a network).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from ale_iac.agent_sdk.config import AgentConfig, AgentRunResult, BridgeKind, TaskPaths
from ale_iac.agent_sdk.deployer import load_deployer_class
from ale_iac.agent_sdk.executor import BridgeLaunch, ModelAccess, Runnable
from ale_iac.bridges.warm import ENTRY_BRIDGES, WarmBridges
from ale_iac.contract import ENDPOINT_TOKEN_ENV, ENDPOINT_TOKEN_FILE_ENV, UnitOutputs
from ale_iac.errors import ConfigError
from ale_iac.executors.local import LocalExecutor
from ale_iac.files import PrivateDir, write_json_atomic
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates.relay import loopback_listener, serve_relay, unix_connector

SPEC_FILE = "_spec.json"
SECRETS_FILE = "_secrets.json"
RESULT_FILE = "_result.json"
DONE_FILE = "_done"
ENTRY_LOG = "_entry.log"
PID_FILE = "_pid"
PRESET_DIR = "_preset"
PRIVATE_FILES = frozenset({SPEC_FILE, SECRETS_FILE, DONE_FILE, PID_FILE, RESULT_FILE})
"""Files of the entry's own in a work dir (not the agent's artifacts)."""
MODEL_TOKEN_SECRET = "ALE_IAC_MODEL_TOKEN"
"""The name the unit's gateway token travels under (in the secrets file or the environment)."""


def build_spec(
    *,
    config: AgentConfig,
    preset_dir: str,
    kind: str,
    sandbox: UnitOutputs,
    work_dir: str,
    task: TaskPaths | None,
    model: ModelAccess | None,
    clis: Mapping[str, str],
    bridges: Mapping[BridgeKind, BridgeLaunch],
    secret_env: list[str],
    prompt: str,
    timeout_s: float,
    relays: list[dict[str, Any]] | None = None,
    secrets_file: str | None = None,
    private_dir: str | None = None,
) -> dict[str, Any]:
    """The entry's spec, JSON-able and free of secrets: ``model`` is given without its key (that
    travels as ``MODEL_TOKEN_SECRET``), the sandbox without its token."""
    deployer_file, _, class_name = config.deployer.rpartition(":")
    return {
        "deployer": {"class": class_name, "file": deployer_file if deployer_file.endswith(".py") else None},
        "config": {**config.model_dump(mode="json"), "source_dir": preset_dir},
        "kind": kind,
        "sandbox": sandbox.model_dump(mode="json", exclude={"endpoint_token"}),
        "work_dir": work_dir,
        "task": task.model_dump(mode="json") if task else None,
        "model": None if model is None else {"api": model.api, "model": model.model, "base_url": model.base_url},
        "clis": dict(clis),
        "bridges": {k: {"command": b.command, "args": list(b.args), "env": dict(b.env)} for k, b in bridges.items()},
        "secret_env": list(secret_env),
        "relays": list(relays or []),
        "secrets_file": secrets_file,
        "private_dir": private_dir,
        "prompt": prompt,
        "timeout_s": timeout_s,
    }


SHIPPED_PACKAGE = "ale_iac"
"""The one package a ``module:Class`` deployer may live in where the entry runs (beside the preset folder)."""


def check_shipped_deployer(kind: str, config: AgentConfig, source: str | Path) -> None:
    """What the entry will load, checked on the host before anything is provisioned: the ``sandbox`` and
    ``docker`` executors ship the preset folder (and ``ale_iac`` with the runtime bundle) and nothing else,
    so a ``file.py:Class`` deployer must be a file inside that folder, named relative to it, and a
    ``module:Class`` one must be a module of ``ale_iac``. (That it imports is the runner's own load of it.)"""
    target = config.deployer.rpartition(":")[0]
    if not target.endswith(".py"):
        if target.split(".")[0] != SHIPPED_PACKAGE:
            raise ConfigError(
                source,
                "deployer",
                f"module {target!r} is not shipped by the {kind} executor (it ships the preset folder and "
                f"{SHIPPED_PACKAGE}): put the deployer in the preset folder and name it 'file.py:Class'",
            )
        return
    folder = Path(config.source_dir).resolve()
    path = (folder / target).resolve()
    if Path(target).is_absolute() or not path.is_relative_to(folder):
        raise ConfigError(
            source,
            "deployer",
            f"{target} is outside the preset folder {folder}; the {kind} executor ships only that folder, so "
            "the deployer would not exist where it runs: move it into the preset folder and name it relative to it",
        )
    if not path.is_file():
        raise ConfigError(source, "deployer", f"{path} is not a file in the preset folder {folder}")


class _InPlaceExecutor(LocalExecutor):
    """The executor a deployer gets where the entry runs: local I/O, and what the spec says about
    the bridges, the model and the CLIs as seen from here."""

    spec: dict[str, Any]
    model_token: str = ""
    endpoint_token: str = ""

    def bridge_launch(self, kind: BridgeKind) -> BridgeLaunch:
        launch = self.spec["bridges"].get(kind)
        if launch is None:
            raise ValueError(f"the {kind} bridge is not offered where this agent runs")
        env = dict(launch["env"])
        if self.endpoint_token:
            # The bridge's only, in a private file: not in the agent's environment, nor in the MCP
            # configuration a deployer writes into the work dir (the run record).
            env[ENDPOINT_TOKEN_FILE_ENV] = str(self.private.write("endpoint-token", self.endpoint_token))
        return BridgeLaunch(command=launch["command"], args=list(launch["args"]), env=env)

    def model_access(self) -> ModelAccess:
        model = self.spec.get("model")
        token = self.model_token
        if not model or not token:
            return super().model_access()  # raises the SDK's "no model" error
        return ModelAccess(api=model["api"], model=model["model"], base_url=model["base_url"], api_key=token)

    def cli(self, name: str) -> str:
        clis: dict[str, str] = self.spec["clis"]
        if name not in clis:
            return super().cli(name)  # raises the SDK's "not staged" error
        return clis[name]


class InSandboxExecutor(_InPlaceExecutor):
    kind: ClassVar[str] = "sandbox"
    native_shell: ClassVar[bool] = True


class InContainerExecutor(_InPlaceExecutor):
    kind: ClassVar[str] = "docker"
    native_shell: ClassVar[bool] = False


IN_PLACE: dict[str, type[_InPlaceExecutor]] = {"sandbox": InSandboxExecutor, "docker": InContainerExecutor}


def _read_secrets(path: Path, names: list[str]) -> dict[str, str]:
    secrets: dict[str, str] = {}
    if path.exists():
        try:
            secrets.update(json.loads(path.read_text()))
        finally:
            path.unlink()  # at once: the agent that starts next must not find it
    for name in names:
        if name in os.environ:
            secrets[name] = os.environ.pop(name)
    return secrets


def _start_relays(relays: list[dict[str, Any]]) -> None:
    """Serve each ``{"listen_port", "unix"}`` relay from a thread of its own (for the entry's life)."""
    for relay in relays:
        listener = loopback_listener(int(relay["listen_port"]))
        connect = unix_connector(str(relay["unix"]))

        def serve(listener: Any = listener, connect: Any = connect) -> None:
            asyncio.run(serve_relay(listener, connect))

        threading.Thread(target=serve, name=f"relay-{relay['listen_port']}", daemon=True).start()


def _redactor(values: list[str]) -> Any:
    secrets = sorted((v for v in values if len(v) >= 6), key=len, reverse=True)

    def redact(text: str) -> str:
        for value in secrets:
            text = text.replace(value, "**********")
        return text

    return redact


def _start_warm_bridges(spec: dict[str, Any]) -> WarmBridges | None:
    """A warm bridge process for the bundle's bridges (``python -m ale_iac.bridges``), started at once: it imports
    the bridges while the deployer installs, once for both bridges, and the bridges the CLI asks for are forked
    from it (``ale_iac/bridges/warm.py``). Their launches are told where it listens. None where no bridge is the
    bundle's, or it cannot start (then each bridge imports for itself). The CLI is launched once the imports
    are done (:class:`_BridgesFirst`)."""
    launches = [b for b in (spec.get("bridges") or {}).values() if list(b["args"][:2]) == ["-m", ENTRY_BRIDGES]]
    if not launches:
        return None
    first = launches[0]
    try:
        warm = WarmBridges(ENTRY_BRIDGES, python=[first["command"]], env={**os.environ, **first["env"]})
    except OSError:  # no writable temporary folder for its socket
        return None
    try:
        warm.start(wait=False)
    except OSError:
        warm.close()
        return None
    for launch in launches:
        launch["env"] = {**launch["env"], **warm.env}
    return warm


class _BridgesFirst:
    """The deployer, launched only once the warm bridges have imported.

    A CLI gives each MCP bridge a fixed time to answer from the moment it starts it (Claude Code at most 60 s),
    and on a unit of one vCPU the bridges' imports and the CLI's own start share that CPU: in a TCG guest under
    load the imports ran past the CLI's limit and Claude Code went on without the ``cua`` bridge (its init:
    ``"cua": "pending"``). Imported first, a bridge is forked at once when the CLI asks for it. On one CPU
    nothing is lost by the order; where there are more, the imports' second or so."""

    def __init__(self, deployer: Runnable, warm: WarmBridges) -> None:
        self.deployer = deployer
        self.warm = warm

    async def install(self) -> None:
        await self.deployer.install()
        # Short waits, so that the agent's own limit (which cancels this) is kept to the second.
        with contextlib.suppress(RuntimeError):  # it died: each bridge imports for itself
            while not await asyncio.to_thread(self.warm.wait_ready, 1.0):
                pass

    async def launch(self, prompt: str) -> AgentRunResult:
        return await self.deployer.launch(prompt)


async def run(spec: dict[str, Any], work_dir: Path) -> AgentRunResult:
    secrets_path = Path(spec.get("secrets_file") or work_dir / SECRETS_FILE)
    secrets = _read_secrets(secrets_path, list(spec.get("secret_env") or []))
    warm = _start_warm_bridges(spec)  # after the secrets left the environment: it inherits what remains
    try:
        return await _run(spec, work_dir, secrets, warm)
    finally:
        if warm is not None:
            warm.close()


async def _run(
    spec: dict[str, Any], work_dir: Path, secrets: dict[str, str], warm: WarmBridges | None
) -> AgentRunResult:
    own = {MODEL_TOKEN_SECRET, ENDPOINT_TOKEN_ENV}
    _start_relays(list(spec.get("relays") or []))
    config = AgentConfig.model_validate(spec["config"])
    executor_cls = IN_PLACE[spec["kind"]]
    executor = executor_cls(
        config=config,
        sandbox=SandboxHandle(**{"stack": "-", **spec["sandbox"]}),
        work_dir=work_dir,
        env={k: v for k, v in secrets.items() if k not in own},
        redact=_redactor(list(secrets.values())),
        task=TaskPaths.model_validate(spec["task"]) if spec.get("task") else None,
    )
    executor.spec = spec
    executor.model_token = secrets.get(MODEL_TOKEN_SECRET, "")
    executor.endpoint_token = secrets.get(ENDPOINT_TOKEN_ENV, "")
    if spec.get("private_dir"):
        executor.private = PrivateDir(spec["private_dir"])
    deployer: Runnable = load_deployer_class(config)(executor)
    if warm is not None:
        deployer = _BridgesFirst(deployer, warm)
    return await executor.run_deployer(deployer, str(spec["prompt"]), float(spec["timeout_s"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ale_iac.executors.entry")
    parser.add_argument("spec", type=Path)
    args = parser.parse_args(argv)
    spec_path: Path = args.spec.resolve()
    spec = json.loads(spec_path.read_text())
    work_dir = Path(spec["work_dir"])
    os.chdir(work_dir)
    try:
        result = asyncio.run(run(spec, work_dir))
    except BaseException as exc:
        traceback.print_exc()
        result = AgentRunResult(status="failed", error=f"the agent's entry failed: {type(exc).__name__}: {exc}")
    write_json_atomic(work_dir / RESULT_FILE, result.model_dump(mode="json"))
    (work_dir / DONE_FILE).write_text("0\n" if result.status == "completed" else "1\n")
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
