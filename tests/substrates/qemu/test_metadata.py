"""The guest agent's metadata readers (``guest/ale-guest-agent``) against the stand-in metadata service's rules
(``metadata_standin.py``), on this host: the stand-in's ``answer`` served over HTTP on 127.0.0.1, the agent's URLs
pointed at it. GCE's path is also proven by the boot in ``test_cloud_disk.py``; EC2's and ECS's session paths
(PUT for a session token, then the user data with it) only here."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from ale_iac.substrates.qemu import disk, metadata_standin

TOKEN = "tok-" + "x" * 40


def _agent() -> ModuleType:
    path = disk.GUEST_DIR / "ale-guest-agent"
    loader = importlib.machinery.SourceFileLoader("ale_guest_agent", str(path))
    spec = importlib.util.spec_from_loader("ale_guest_agent", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[str]:
    """The stand-in's rules on a 127.0.0.1 port, with the token and a TTL as the instance's values."""
    values = {"ale-endpoint-token": TOKEN, "ale-ttl-seconds": "3600"}
    session = tmp_path / metadata_standin.SESSION_FILE

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body = metadata_standin.answer(self.command, self.path, headers, values, session)
            payload = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PUT = _serve  # noqa: N815 (http.server's names)

        def log_message(self, format: str, *args: object) -> None:
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_agent_reads_gce_attributes_only_with_the_flavor_header(
    standin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = _agent()
    monkeypatch.setattr(agent, "GCE_ATTRIBUTES", f"{standin}/computeMetadata/v1/instance/attributes/")
    assert agent.gce_values() == {"ale-endpoint-token": TOKEN, "ale-ttl-seconds": "3600"}
    plain = agent.fetch(agent.urllib.request.Request(f"{standin}/computeMetadata/v1/instance/attributes/x"))
    assert plain is None  # 403 without Metadata-Flavor: Google: no value


@pytest.mark.parametrize("cloud", ["ec2", "ecs"])
def test_the_agent_reads_the_user_data_through_a_metadata_session(
    cloud: str, standin: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = _agent()
    session, user_data = f"{standin}/latest/api/token", f"{standin}/latest/user-data"
    if cloud == "ec2":
        monkeypatch.setattr(agent, "EC2_SESSION", session)
        monkeypatch.setattr(agent, "EC2_USER_DATA", user_data)
        assert agent.ec2_values() == {"ale-endpoint-token": TOKEN, "ale-ttl-seconds": "3600"}
    else:
        # The stand-in keeps EC2's header names; the agent's ECS reader is the same session code with Alibaba's.
        assert agent.session_user_data(session, user_data, "X-aws-ec2-metadata-token")["ale-endpoint-token"] == TOKEN
        assert agent.session_user_data(session, user_data, "X-aliyun-ecs-metadata-token") == {}
    # Without the session token the user data is refused (401), so nothing is read.
    assert agent.fetch(agent.urllib.request.Request(user_data)) is None


def test_only_the_agents_keys_are_taken_from_a_user_data_text() -> None:
    agent = _agent()
    text = b"#!/bin/sh\necho ale-endpoint-token=no\nale-endpoint-token = t1\nother=1\nale-ttl-seconds=60\n"
    assert agent.from_user_data(text) == {"ale-endpoint-token": "t1", "ale-ttl-seconds": "60"}
    assert agent.from_user_data(None) == {}
    assert json.dumps(agent.from_user_data(b"ale-endpoint-token=\n")) == "{}"


def test_gc_finds_and_removes_a_cloud_disk_boot_whose_starter_is_gone(tmp_path: Path) -> None:
    """A process that looks like a cloud boot's QEMU (its name and serial log on the command line) and whose
    folder's owner is a pid that has exited: the qemu substrate's leftovers list it, and removing it ends the
    process and the folder; a boot whose owner lives is left alone."""
    import subprocess
    import sys

    from ale_iac.substrates import registry
    from ale_iac.substrates.qemu import cloud_boot

    def fake_boot(guest_dir: Path, owner: int) -> subprocess.Popen[bytes]:
        guest_dir.mkdir()
        (guest_dir / cloud_boot.OWNER).write_text(f"{owner}\n")
        argv = ["-name", cloud_boot.QEMU_NAME, "-serial", f"file:{guest_dir / 'serial.log'}"]
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv])

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = fake_boot(tmp_path / "orphan", dead.pid)
    kept = fake_boot(tmp_path / "kept", os.getpid())
    try:
        found = [left for left in registry.get("qemu").leftovers() if left.name in ("orphan", "kept")]
        assert [left.name for left in found] == ["orphan"]
        found[0].remove()
        assert orphan.wait(timeout=30) is not None and not (tmp_path / "orphan").exists()
        assert kept.poll() is None and (tmp_path / "kept").is_dir()
    finally:
        for proc in (orphan, kept):
            proc.kill()
            proc.wait(timeout=10)
