"""One dynamic-provider process per :class:`~ale_iac.engine.Engine`, shared by all of its CLI calls.

Every ``pulumi up`` or ``destroy`` of a stack with dynamic resources (the ``local``, ``docker`` and
``qemu`` sandboxes) would otherwise start ``pulumi-resource-pulumi-python``: a Python process that
imports the Pulumi SDK and grpc before it serves its first call (0.4 CPU-s for the imports alone), twice
per ephemeral unit: 0.2 s of wall time and of CPU per call in all (``bench/bench_engine.py --unit-path``).
Instead the engine starts the SDK's own provider server once (``python -m pulumi.dynamic``, unchanged, run
from :func:`main`) and points every CLI call at it with
``PULUMI_DEBUG_PROVIDERS=pulumi-python:<port>``, the CLI's documented way to attach to a provider
that already runs (the CLI then neither starts nor kills it).

What the shim around the SDK's server adds:

* **Only our own uid gets in.** The server listens on ``127.0.0.1`` without authentication (as the
  per-call plugin does, for the length of one operation) and runs whatever pickled provider a request
  carries. Each call's TCP peer is looked up in ``/proc/net/tcp``: a connection from a socket owned by
  another uid is refused with PERMISSION_DENIED. Sandboxes never reach the host's loopback (their own
  network namespace), and our uid can read the passphrase and the state anyway.
* **More workers** than the SDK's four, so concurrent units' creates do not queue behind each other.
* **It ends with its engine**: it exits when its standard input (a pipe from the engine's process)
  closes or its parent changes, so a runner killed with SIGKILL leaves no provider behind; SIGINT and
  SIGTERM sent to the run's process group are ignored, so a run's cleanup (its destroys) can still
  reach it after Ctrl-C. ``ale_iac.engine.sweep_orphan_providers`` is the backstop.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent import futures
from typing import Any

from ale_iac.procs import stop_by_closing_stdin

PROVIDER_PACKAGE = "pulumi-python"
"""The package name the CLI gives Python dynamic providers (``pulumi:providers:pulumi-python``)."""
MODULE = "ale_iac.provider_host"
START_TIMEOUT_S = 60.0
WORKERS = 64
PARENT_POLL_S = 0.25


class ProviderHostError(RuntimeError):
    """The provider process did not start (its stderr says why)."""


class ProviderHost:
    """The shared provider process of one engine: started on first use, stopped by :meth:`close`."""

    def __init__(self, env: Callable[[], Mapping[str, str]]) -> None:
        """``env``: the process environment, read when the process starts (as a plugin's is at each call)."""
        self._env = env
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def port(self) -> int:
        """The port of the running provider server, starting it if needed (thread-safe)."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None and self._port is not None:
                return self._port
            self._stop_locked()
            self._proc, self._port = _spawn(self._env())
            return self._port

    def attach_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``PULUMI_DEBUG_PROVIDERS`` with our provider added to whatever ``base`` already attaches."""
        other = [
            item
            for item in (base or {}).get("PULUMI_DEBUG_PROVIDERS", "").split(",")
            if item and not item.startswith(f"{PROVIDER_PACKAGE}:")
        ]
        return {"PULUMI_DEBUG_PROVIDERS": ",".join([*other, f"{PROVIDER_PACKAGE}:{self.port()}"])}

    def close(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        proc, self._proc, self._port = self._proc, None, None
        if proc is not None:
            stop_by_closing_stdin(proc, timeout=5)


def _spawn(env: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", MODULE, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,  # the provider's tracebacks reach the engine's own stderr, as the plugin's do
        env=dict(env),
        close_fds=True,
    )
    assert proc.stdout is not None
    line = _read_line(proc, START_TIMEOUT_S)
    try:
        return proc, int(line)
    except ValueError:
        proc.kill()
        proc.wait()
        raise ProviderHostError(f"the dynamic provider host printed {line!r} instead of its port") from None


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The first line of ``proc``'s stdout (its port), or an error if it exits or takes too long."""
    result: list[bytes] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline() if proc.stdout else b""))
    reader.daemon = True
    reader.start()
    reader.join(timeout)
    if not result or not result[0]:
        proc.kill()
        code = proc.wait()
        raise ProviderHostError(
            f"the dynamic provider host did not start (exit {code}, {timeout:.0f} s limit; its stderr is above)"
        )
    return result[0].decode().strip()


# --- the provider process -----------------------------------------------------------------------


ESTABLISHED = "01"
"""A connection's state in ``/proc/net/tcp*`` (``st``): only a live connection names its owner. A closed one
of the same local port in TIME_WAIT is listed with uid 0 (the kernel keeps no owner for it), and a port can
also carry connections to other servers: such a row, read first, once refused a normal user's own CLI as
"caller's uid 0" in a shuffled suite run."""


def socket_uid(
    peer: str,
    server_ports: Collection[int] | None = None,
    tables: Sequence[str] = ("/proc/net/tcp", "/proc/net/tcp6"),
) -> int | None:
    """The uid owning the calling end of a loopback TCP connection, from a grpc peer string
    (``ipv4:127.0.0.1:PORT`` or ``ipv6:[::1]:PORT``); None if it is not found. An IPv4 caller may sit on
    a dual-stack socket, listed in ``tcp6`` under its v4-mapped address. Only established connections count,
    and with ``server_ports`` only those to one of them (the ports this server listens on)."""
    kind, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    try:
        if kind == "ipv4":
            v4 = socket.inet_pton(socket.AF_INET, host)
            candidates = {_proc_net_hex(v4), _proc_net_hex(b"\0" * 10 + b"\xff\xff" + v4)}
        elif kind == "ipv6":
            candidates = {_proc_net_hex(socket.inet_pton(socket.AF_INET6, host.strip("[]")))}
        else:
            return None
        wanted = {f"{address}:{int(port):04X}" for address in candidates}
    except (OSError, ValueError):
        return None
    for table in tables:
        with contextlib.suppress(OSError), open(table) as handle:
            next(handle, None)
            for row in handle:
                fields = row.split()
                # sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
                if len(fields) <= 7 or fields[1] not in wanted or fields[3] != ESTABLISHED:
                    continue
                if server_ports is None or int(fields[2].rpartition(":")[2], 16) in server_ports:
                    return int(fields[7])
    return None


def _own_server_ports() -> Callable[[], set[int]]:
    """The TCP ports this process listens on (the provider server's), read once: they are bound before the
    first call arrives and stay so, and a call is no place to scan the process's sockets again."""
    import psutil

    ports: set[int] = set()

    def get() -> set[int]:
        if not ports:
            conns = psutil.Process().net_connections(kind="tcp")
            ports.update(c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN)
        return ports

    return get


def _proc_net_hex(packed: bytes) -> str:
    """An address as ``/proc/net/tcp*`` print it: each 32-bit word in host byte order, in hex."""
    words = [packed[i : i + 4] for i in range(0, len(packed), 4)]
    return "".join((word[::-1] if sys.byteorder == "little" else word).hex() for word in words).upper()


def _own_uid_only(uid_of: Callable[[str], int | None]) -> Any:
    """A grpc server interceptor refusing calls whose peer socket another uid owns."""
    import grpc

    me = os.getuid()

    def check(handler: Any) -> Any:
        inner = handler.unary_unary

        def guarded(request: Any, context: Any) -> Any:
            owner = uid_of(context.peer())
            if owner != me:
                context.abort(grpc.StatusCode.PERMISSION_DENIED, f"caller's uid {owner} is not {me}")
            return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    class OwnUidOnly(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc has no type hints
        def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
            handler = continuation(details)
            if handler is None or handler.unary_unary is None:
                return handler  # the provider protocol's calls are all unary
            return check(handler)

    return OwnUidOnly()


def _exit_with_parent(parent: int) -> None:
    """Exit at once when stdin closes (the engine closed it or died) or the parent is gone."""

    def on_eof() -> None:
        with contextlib.suppress(OSError):
            while sys.stdin.buffer.read(4096):
                pass
        os._exit(0)

    def on_orphan() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    for watcher in (on_eof, on_orphan):
        threading.Thread(target=watcher, daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """Serve the SDK's dynamic provider (``python -m pulumi.dynamic``) behind the uid check, with
    ``Attach`` answered and more workers (both by wrapping the grpc calls its ``main`` makes)."""
    args = sys.argv[1:] if argv is None else argv
    parent = int(args[0]) if args else os.getppid()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    _exit_with_parent(parent)

    import grpc

    plain_server = grpc.server
    server_ports = _own_server_ports()

    def server(_executor: Any = None, *, options: Any = None, **kwargs: Any) -> Any:
        del kwargs  # the SDK passes nothing else
        return plain_server(
            futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="provider"),
            options=options,
            interceptors=[_own_uid_only(lambda peer: socket_uid(peer, server_ports()))],
        )

    grpc.server = server

    # The CLI tells an attached provider its engine's address with ``Attach`` (a provider it starts gets
    # it as an argument); the SDK's server does not implement it and needs no engine, so it only says yes.
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import provider_pb2_grpc

    plain_add = provider_pb2_grpc.add_ResourceProviderServicer_to_server

    def add_servicer(servicer: Any, grpc_server: Any) -> None:
        servicer.Attach = lambda request, context: empty_pb2.Empty()
        plain_add(servicer, grpc_server)

    provider_pb2_grpc.add_ResourceProviderServicer_to_server = add_servicer  # type: ignore[assignment]
    runpy.run_module("pulumi.dynamic", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
