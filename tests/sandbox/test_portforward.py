"""``sandbox.portforward`` without a cluster: the kubectl command (no secret in it), the clusters a home
remembers for gc, which forwards gc counts as orphans (their owner gone), and the endpoint staying open while
kubectl is started again, against a stand-in for kubectl (a cluster cannot make kubectl end a forward on cue).
The forward itself, on a real cluster: tests/infra/test_kubernetes_cluster.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale_iac.contract import PortForward
from ale_iac.sandbox import portforward


def target(**extra: object) -> PortForward:
    return PortForward.model_validate(
        {"kubeconfig": "/k/config", "namespace": "ns", "pod": "p-1", "port": 8443, **extra}
    )


def test_the_command_binds_loopback_and_names_the_kubeconfig_by_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(portforward, "find_kubectl", lambda: Path("/bin/kubectl"))
    argv = portforward.command(target(context="c"))
    assert argv == [
        "/bin/kubectl", "--kubeconfig", "/k/config", "--context", "c", "-n", "ns", "port-forward",
        "--address", "127.0.0.1", "pod/p-1", ":8443",
    ]  # fmt: skip
    assert portforward.command(target(), 4321)[-1] == "4321:8443"


def test_each_cluster_is_remembered_once_for_gc() -> None:
    assert portforward.known_clusters() == set()
    portforward.remember(target())
    portforward.remember(target(pod="p-2"))  # the same cluster
    portforward.remember(target(namespace="other"))
    assert portforward.known_clusters() == {
        portforward.Cluster("/k/config", None, "ns"),
        portforward.Cluster("/k/config", None, "other"),
    }


def test_a_forward_whose_owner_is_gone_is_an_orphan() -> None:
    """A stand-in for kubectl (a process with port-forward in its argv and the owner variable) is an orphan
    once the process its variable names is gone, and not while it runs."""
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = portforward.procs.start_time(owner.pid)
    fake = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "port-forward"],
        env={**os.environ, portforward.OWNER_ENV: f"{owner.pid}:{started}"},
    )
    try:
        deadline = time.monotonic() + 5
        while portforward.procs.argv(fake.pid)[-1:] != ["port-forward"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.pid not in portforward.sweep_orphans(dry_run=True)
        owner.kill()
        owner.wait()
        assert fake.pid in portforward.sweep_orphans(dry_run=True)
        assert fake.pid in portforward.sweep_orphans()
        assert fake.wait(timeout=10) == -9
    finally:
        for proc in (owner, fake):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# A stand-in for `kubectl port-forward ... LOCAL:REMOTE`: it listens where kubectl would, prints kubectl's line,
# and answers each connection's line with its own start count. While the file `end` exists, it ends as kubectl
# ends a forward at a stream's error: its listener closed first, then the reply, then gone.
STAND_IN = """\
import os, pathlib, socket, sys
folder = pathlib.Path(os.environ["STAND_IN_DIR"])
starts = folder / "starts"
starts.write_text(starts.read_text() + "x" if starts.exists() else "x")
local = sys.argv[-1].split(":")[0]
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(local or 0)))
listener.listen(8)
print(f"Forwarding from 127.0.0.1:{listener.getsockname()[1]} -> 8443", flush=True)
while True:
    connection, _ = listener.accept()
    line = connection.makefile("rb").readline()
    ending = (folder / "end").exists()
    if ending:
        (folder / "end").unlink()
        listener.close()
    connection.sendall(b"start %d: " % len(starts.read_text()) + line)
    connection.close()
    if ending:
        sys.exit(1)
"""


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f"#!{sys.executable}\n" + STAND_IN)
    kubectl.chmod(0o755)
    monkeypatch.setenv("ALE_IAC_KUBECTL", str(kubectl))
    monkeypatch.setenv("STAND_IN_DIR", str(tmp_path))
    yield tmp_path
    portforward.close(target())


def ask(port: int, line: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(line + b"\n")
        return connection.makefile("rb").readline()


def test_the_endpoint_waits_for_kubectl_started_again_instead_of_refusing(stand_in: Path) -> None:
    url = portforward.local_endpoint(target())
    port = int(url.rsplit(":", 1)[1])
    assert ask(port, b"one") == b"start 1: one\n"
    (stand_in / "end").touch()
    assert ask(port, b"two") == b"start 1: two\n"  # the stand-in's last reply: it is gone now
    # At once, while it is started again: the relay holds the connection until the new one listens.
    assert ask(port, b"three") == b"start 2: three\n"
    assert portforward.local_endpoint(target()) == url  # the same endpoint for every handle
    portforward.close(target())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
    assert (stand_in / "starts").read_text() == "xx"
