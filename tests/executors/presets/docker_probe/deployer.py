"""A probe deployer for the ``docker`` executor's tests: it runs inside the agent's container and reports
what it can see and reach there. It uses only the agent SDK and the standard library (it runs from the
runtime bundle with the image's Python).

``settings.mode``:

* ``probe`` (default): write ``probe.json``: mounts, capabilities, network interfaces, what it could write,
  which host paths and addresses it reached, the secrets it got (as hashes), the sandbox through the
  relay, the model gateway through the relay, and what the SDK said (bridges, CLIs, model);
* ``block``: ask the sandbox for ``/block``, which the test's server never answers;
* ``hang``: ``launch`` waits forever (the entry's own deadline ends it and reports a timeout);
* ``freeze``: ``install`` blocks the entry's event loop for good (only the engine's kill ends it);
* ``exit``: print a marker and end the process at once, leaving no result.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from ale_iac.agent_sdk import AgentInfo, AgentRunResult, BaseAgentDeployer, Trajectory, TrajectoryBuilder

EXIT_MARKER = "docker-probe: exiting without a result"
WRITE_TARGETS = (
    "/work/probe-write.txt",
    "/tmp/probe-write.txt",
    "/root/probe-write.txt",
    "/probe-write.txt",
    "/usr/probe-write.txt",
    "/opt/ale-iac/runtime/src/probe-write.txt",
    "/opt/ale-iac/runtime/site/probe-write.txt",
    "/opt/ale-iac/preset/probe-write.txt",
)


def _digest(value: str | None) -> str | None:
    return hashlib.sha256(value.encode()).hexdigest() if value is not None else None


def _mounts() -> list[dict[str, str]]:
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            sep = fields.index("-")
            found.append(
                {"point": fields[4], "options": fields[5], "fstype": fields[sep + 1], "source": fields[sep + 2]}
            )
    return found


def _status(field: str) -> str:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return ""


def _try_write(path: str) -> str:
    try:
        with open(path, "w") as handle:
            handle.write("x")
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror}"
    os.unlink(path)
    return "ok"


def _try_connect(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=3):
            return "connected"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"


def _model_call(base_url: str, model: str, key: str) -> dict[str, Any]:
    """One non-streaming Anthropic Messages call through the gateway: its status and answer text."""
    body = json.dumps(
        {"model": model, "max_tokens": 16, "stream": False, "messages": [{"role": "user", "content": "probe"}]}
    ).encode()
    headers = {"content-type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"}
    request = urllib.request.Request(base_url + "/v1/messages", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
            return {"status": response.status, "text": "".join(b.get("text", "") for b in answer["content"])}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "text": ""}


def _http(url: str, token: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return {"status": response.status, "body": response.read().decode()}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "body": ""}
    except OSError as exc:
        return {"status": None, "body": f"{type(exc).__name__}: {exc}"}


class DockerProbe(BaseAgentDeployer):
    default_executor: ClassVar[str] = "docker"
    supported_executors: ClassVar[frozenset[str]] = frozenset({"docker"})

    async def install(self) -> None:
        if self.config.settings.get("mode") == "freeze":
            self.executor.write_text("install.log", "freezing in install\n")
            time.sleep(3600)  # the event loop with it: no asyncio deadline can fire
        self.executor.write_text("install.log", f"kind={self.executor.kind}\n")

    async def launch(self, prompt: str) -> AgentRunResult:
        mode = self.config.settings.get("mode", "probe")
        # The sandbox's token, where the entry hands it to the bridges: a private file their env names.
        token_file = self.executor.bridge("vm").env.get("ALE_IAC_ENDPOINT_TOKEN_FILE")
        token = Path(token_file).read_text() if token_file else None
        if mode == "exit":
            print(EXIT_MARKER, file=sys.stderr, flush=True)
            os._exit(7)
        if mode == "hang":
            self.executor.write_text("hanging", "1\n")
            await asyncio.Event().wait()
        if mode == "block":
            _http(self.executor.sandbox.endpoint + "/block", token)
            return AgentRunResult(status="completed")
        self.executor.write_text("probe.json", json.dumps(self._probe(prompt, token), indent=2))
        return AgentRunResult(status="completed", logs=["probe.json"])

    def _probe(self, prompt: str, token: str | None) -> dict[str, Any]:
        settings = self.config.settings
        report: dict[str, Any] = {
            "kind": self.executor.kind,
            "native_shell": self.executor.native_shell,
            "prompt": prompt,
            "uid": os.getuid(),
            "cap_eff": _status("CapEff"),
            "no_new_privs": _status("NoNewPrivs"),
            "hostname": socket.gethostname(),
            "cwd": os.getcwd(),
            "mounts": _mounts(),
            "interfaces": sorted(os.listdir("/sys/class/net")),
            "writes": {path: _try_write(path) for path in WRITE_TARGETS},
            "host_paths": {path: os.path.exists(path) for path in settings.get("host_paths", [])},
            "connects": {f"{h}:{p}": _try_connect(h, int(p)) for h, p in settings.get("targets", [])},
            "secret_digest": _digest(self.executor.env.get("ALE_TEST_API_KEY")),
            "token_digest": _digest(token),
            "secret_names_in_os_environ": sorted(n for n in os.environ if n.startswith(("ALE_TEST", "ALE_IAC_"))),
            "socket_dir": sorted(os.listdir("/run/ale-iac")),
            "sandbox_endpoint": self.executor.sandbox.endpoint,
            "sandbox": _http(self.executor.sandbox.endpoint + "/probe", token),
            "sandbox_without_token": _http(self.executor.sandbox.endpoint + "/probe", None),
            "bridges": {kind: asdict(self.executor.bridge(kind)) for kind in ("vm", "cua")},
        }
        try:
            access = self.executor.model_access()
        except Exception as exc:
            report["model"] = {"error": str(exc)}
        else:
            report["model"] = {
                "base_url": access.base_url,
                "model": access.model,
                "right_token": _model_call(access.base_url, access.model, access.api_key),
                "wrong_token": _model_call(access.base_url, access.model, "not-the-unit-token-0123456789"),
            }
        report["clis"] = {name: self.executor.cli(name) for name in settings.get("cli_names", [])}
        return report

    def parse_artifacts(self, result: AgentRunResult) -> Trajectory:
        builder = TrajectoryBuilder(session_id="docker-probe", agent=AgentInfo(name=self.config.name))
        builder.add("agent", self.executor.read_text("probe.json") if self.executor.exists("probe.json") else "{}")
        return builder.build(notes=result.status)
