"""A Kubernetes unit's endpoint: the API server's port-forward to its pod, opened on this host's 127.0.0.1.

A ``kubernetes`` unit's pod exposes nothing (no NodePort, no LoadBalancer; its forwarder listens on the pod's
own loopback). The runner reaches it the way a user reaches a pod of a remote cluster: ``kubectl port-forward``
(``toolchain.find_kubectl``: the one ``scripts/kube-cluster.sh`` built, else the host's), bound to
``127.0.0.1`` at a port the kernel picks, through the API server the unit's kubeconfig names. The forwarder
behind it still admits only requests with the unit's token, so the forward adds reach and no authority.

One forward per pod and process, kept while it lives and reused by every handle of the unit. kubectl ends a
forward at the first connection the pod refuses (the unit's forwarder is not listening yet), and at other errors
of its streams (a CI run saw it end right after the model channel test's connections closed), so each forward is
supervised: kubectl is started again on its port until the forward is closed or the pod is gone (a reset replaced
it; the next handle forwards to the new pod). The unit's endpoint is not kubectl's port but a relay of ours in
front of it (``sandbox.holding_relay``), which stays open across those restarts: a connection made while kubectl
starts again waits for it instead of being refused. A forward is closed when its unit is released
(``SandboxHandle.close_port_forward``: a run is done with the unit, destroyed, retained or back in its pool), and
every one when this process exits (:func:`close_all`, at ``atexit``). kubectl does not end when the pod it forwards
to is deleted (it fails only the connections made after), so a process killed with SIGKILL leaves its kubectl
running until ``ale-iac gc`` stops it (:func:`sweep_orphans`; its relay goes with the process).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

import psutil

from ale_iac import procs
from ale_iac.contract import PortForward
from ale_iac.errors import AleIacError
from ale_iac.files import write_json_atomic
from ale_iac.paths import ale_home
from ale_iac.sandbox.holding_relay import HoldingRelay
from ale_iac.toolchain import find_kubectl

OWNER_ENV = "ALE_IAC_FORWARD_OWNER"
"""In each forward's kubectl environment: ``<pid>:<start time>`` of the process that opened it (for
:func:`sweep_orphans`: a runner killed with SIGKILL leaves its forwards behind)."""
CLUSTERS_FILE = "kubernetes-clusters.json"
"""In the ale-iac home: every cluster (kubeconfig, context, namespace) this home reached a unit on, for gc."""

OPEN_TIMEOUT_S = 60.0
"""How long a forward may take to open (kubectl's start and the API server's first answer; a pod that has not
started yet is retried until then)."""
RESTART_PATIENCE_S = 30.0
"""How long a connection to the unit's endpoint waits for kubectl to be started again (which takes about a second)."""
_FORWARDING = re.compile(rb"Forwarding from 127\.0\.0\.1:(\d+) ->")


class PortForwardError(AleIacError):
    """The forward could not be opened; the message names the pod and carries kubectl's words."""


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


def command(target: PortForward, local_port: int = 0) -> list[str]:
    """The kubectl command line of the forward (no secret in it: the kubeconfig is a path). ``local_port`` 0: the
    kernel picks one."""
    argv = [str(find_kubectl()), "--kubeconfig", target.kubeconfig]
    if target.context:
        argv += ["--context", target.context]
    ports = f"{local_port}:{target.port}" if local_port else f":{target.port}"
    return [*argv, "-n", target.namespace, "port-forward", "--address", "127.0.0.1", f"pod/{target.pod}", ports]


def _spawn(target: PortForward, local_port: int) -> tuple[subprocess.Popen[bytes], int | None, str]:
    """Start kubectl; its process, the local port once it listens (None if it exited first), what it said."""
    process = subprocess.Popen(
        command(target, local_port),
        env={**os.environ, OWNER_ENV: _OWNER},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert process.stdout is not None
    said: list[bytes] = []
    while line := process.stdout.readline():  # kubectl prints the line once it listens, or exits
        said.append(line)
        match = _FORWARDING.search(line)
        if match is not None:
            return process, int(match.group(1)), ""
    process.wait()
    process.stdout.close()
    return process, None, b"".join(said).decode(errors="replace").strip()


def _owner() -> str:
    return f"{os.getpid()}:{procs.start_time(os.getpid())}"


_OWNER = _owner()


def sweep_orphans(dry_run: bool = False) -> list[int]:
    """Kill the forwards (kubectl processes carrying :data:`OWNER_ENV`) whose owner is gone; their pids."""
    killed: list[int] = []
    for pid in procs.all_pids():
        if "port-forward" not in procs.argv(pid)[1:8]:
            continue
        try:
            owner = psutil.Process(pid).environ().get(OWNER_ENV, "")
        except psutil.Error:
            continue
        owner_pid, _, started = owner.partition(":")
        if not owner_pid.isdigit():
            continue
        if procs.is_running(int(owner_pid), float(started) if started not in ("", "None") else None):
            continue
        if not dry_run:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    return killed


def _gone(said: str) -> bool:
    """Whether kubectl's words say the pod is gone (replaced or deleted): then there is nothing to forward to."""
    return "NotFound" in said or "not found" in said


class _Forward:
    """One pod's forward: kubectl on a fixed port of its own, started again on that port whenever it exits, until
    it is closed or the pod is gone; and the unit's endpoint, a relay on a port of ours whose connections wait for
    kubectl while it starts again."""

    def __init__(self, target: PortForward, process: subprocess.Popen[bytes], kubectl_port: int) -> None:
        self.target = target
        self.kubectl_port = kubectl_port
        self.process = process
        self.closed = threading.Event()
        self.gone = False
        self.said: collections.deque[str] = collections.deque(maxlen=5)
        self.relay = HoldingRelay(kubectl_port, self.alive, RESTART_PATIENCE_S, target.pod)
        self.port: int = self.relay.port
        threading.Thread(target=self._supervise, name=f"port-forward {target.pod}", daemon=True).start()

    def alive(self) -> bool:
        return not self.closed.is_set() and not self.gone

    def _supervise(self) -> None:
        while not self.closed.is_set():
            process = self.process
            assert process.stdout is not None
            with contextlib.suppress(ValueError, OSError):
                for line in process.stdout:  # its lines, read so that its pipe never fills
                    self.said.append(line.decode(errors="replace").strip())
            process.wait()
            process.stdout.close()
            if self.closed.is_set() or _gone(" ".join(self.said)):
                self.gone = not self.closed.is_set()
                return
            while not self.closed.is_set():
                restarted, port, said = _spawn(self.target, self.kubectl_port)
                if port is not None:
                    self.process = restarted
                    break
                if _gone(said):
                    self.gone = True
                    return
                self.closed.wait(0.2)

    def close(self) -> None:
        self.closed.set()
        self.relay.close()
        process = self.process
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def local_endpoint(target: PortForward, timeout_s: float = OPEN_TIMEOUT_S) -> str:
    """The unit's endpoint on this host (``http://127.0.0.1:<port>``): its forward, opened if need be (a pod that
    is not running yet is retried until ``timeout_s``)."""
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
            process, port, said = _spawn(target, 0)
            if port is not None:
                forward = _Forward(target, process, port)
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
