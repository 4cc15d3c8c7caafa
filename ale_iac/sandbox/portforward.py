"""A Kubernetes unit's endpoint: the API server's port-forward to its pod, opened on this host's 127.0.0.1.

A ``kubernetes`` unit's pod exposes nothing (no NodePort, no LoadBalancer; its forwarder listens on the pod's
own loopback). The runner reaches it the way a user reaches a pod of a remote cluster: ``kubectl port-forward``
(``toolchain.find_kubectl``: the one ``scripts/kube-cluster.sh`` built, else the host's), bound to
``127.0.0.1`` at a port the kernel picks, through the API server the unit's kubeconfig names. The forwarder
behind it still admits only requests with the unit's token, so the forward adds reach and no authority.

One forward per pod and process, kept while it lives and reused by every handle of the unit; a forward whose
kubectl has exited (its pod was replaced by a reset, the API server went away) is opened anew on the next
:func:`local_endpoint`. Every forward is closed when this process exits (:func:`close_all`, at ``atexit``); a
process killed with SIGKILL leaves its kubectl running until the pod it forwards to is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass

from ale_iac.contract import PortForward
from ale_iac.errors import AleIacError
from ale_iac.files import write_json_atomic
from ale_iac.paths import ale_home
from ale_iac.toolchain import find_kubectl

CLUSTERS_FILE = "kubernetes-clusters.json"
"""In the ale-iac home: every cluster (kubeconfig, context, namespace) this home reached a unit on, for gc."""

OPEN_TIMEOUT_S = 60.0
"""How long a forward may take to open (kubectl's start and the API server's first answer; a pod that has not
started yet is retried until then)."""
_FORWARDING = re.compile(rb"Forwarding from 127\.0\.0\.1:(\d+) ->")


class PortForwardError(AleIacError):
    """The forward could not be opened; the message names the pod and carries kubectl's words."""


@dataclass
class _Forward:
    process: subprocess.Popen[bytes]
    port: int

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@dataclass(frozen=True)
class Cluster:
    """Where a unit's objects are: a kubeconfig file (its path), a context and a namespace."""

    kubeconfig: str
    context: str | None
    namespace: str


def known_clusters() -> set[Cluster]:
    """The clusters this home has reached units on (:func:`remember`)."""
    try:
        entries = json.loads((ale_home() / CLUSTERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    return {
        Cluster(str(e["kubeconfig"]), e.get("context"), str(e["namespace"])) for e in entries if isinstance(e, dict)
    }


def remember(target: PortForward) -> None:
    """Record the unit's cluster for ``ale-iac gc`` (once per cluster)."""
    cluster = Cluster(target.kubeconfig, target.context, target.namespace)
    known = known_clusters()
    if cluster in known:
        return
    known.add(cluster)
    entries = [dataclasses.asdict(c) for c in sorted(known, key=lambda c: (c.kubeconfig, c.context or "", c.namespace))]
    write_json_atomic(ale_home() / CLUSTERS_FILE, entries)


_LOCK = threading.Lock()
_FORWARDS: dict[PortForward, _Forward] = {}


def command(target: PortForward) -> list[str]:
    """The kubectl command line of the forward (no secret in it: the kubeconfig is a path)."""
    argv = [str(find_kubectl()), "--kubeconfig", target.kubeconfig]
    if target.context:
        argv += ["--context", target.context]
    return [
        *argv,
        "-n",
        target.namespace,
        "port-forward",
        "--address",
        "127.0.0.1",
        f"pod/{target.pod}",
        f":{target.port}",
    ]


def _start(target: PortForward) -> tuple[_Forward | None, str]:
    """One try: a forward, or None and what kubectl said."""
    process = subprocess.Popen(
        command(target),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()  # kubectl prints the line once it listens, or exits
    match = _FORWARDING.search(line)
    if match is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        said = (line + process.stderr.read() if process.poll() is not None else line).decode(errors="replace")
        _Forward(process, 0).close()
        return None, said.strip()
    # What kubectl prints later (one line per connection) is read and dropped, so its pipe never fills.
    threading.Thread(target=_drain, args=(process,), daemon=True).start()
    return _Forward(process, int(match.group(1))), ""


def _drain(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ValueError, OSError):
        assert process.stdout is not None
        for _ in process.stdout:
            pass


def local_endpoint(target: PortForward, timeout_s: float = OPEN_TIMEOUT_S) -> str:
    """The unit's endpoint on this host (``http://127.0.0.1:<port>``): its forward, opened if need be."""
    with _LOCK:
        forward = _FORWARDS.get(target)
        if forward is not None and forward.alive():
            return f"http://127.0.0.1:{forward.port}"
        if forward is not None:
            forward.close()
            del _FORWARDS[target]
        remember(target)
        deadline = time.monotonic() + timeout_s
        while True:
            forward, said = _start(target)
            if forward is not None:
                _FORWARDS[target] = forward
                return f"http://127.0.0.1:{forward.port}"
            if time.monotonic() >= deadline:
                raise PortForwardError(
                    f"cannot open a port-forward to pod {target.namespace}/{target.pod}: "
                    f"{said or 'kubectl said nothing'}"
                )
            time.sleep(0.5)


def close(target: PortForward) -> None:
    """Close the unit's forward, if this process opened one."""
    with _LOCK:
        forward = _FORWARDS.pop(target, None)
    if forward is not None:
        forward.close()


@atexit.register
def close_all() -> None:
    """Close every forward this process opened."""
    with _LOCK:
        forwards = list(_FORWARDS.values())
        _FORWARDS.clear()
    for forward in forwards:
        forward.close()
