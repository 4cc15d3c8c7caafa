"""ale-iac's Python stand-in for Pulumi's Go language host (``pulumi-language-python``).

The Go host (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3) cannot be built
from the Go module proxy (it answers 403 for that module), and without a language host the Pulumi
CLI cannot run a Python *project* (``pulumi preview/up/refresh/destroy`` in a directory with
``Pulumi.yaml``; Automation API inline programs do not need one). ``scripts/build-pulumi.sh``
installs the launcher ``scripts/pulumi-language-python`` beside the CLI instead: it runs
:func:`main` on an interpreter with the ``pulumi`` and ``grpcio`` packages
(``ALE_IAC_LANGUAGE_HOST_PYTHON``; ``scripts/setup.sh`` uses ``.venv/bin/python``).

How the CLI uses it (PULUMI_VERSION of ``versions.env``): it starts ``pulumi-language-python
[flags] <engine address>`` in the program directory (flags only with ``--logflow``/``--tracing``:
``--logtostderr``, ``-v=N``, ``--tracing URL``), reads the gRPC port from the first line of stdout
and calls the ``pulumirpc.LanguageRuntime`` service. Everything else the host prints to
stdout/stderr is shown to the user, which is why the program's output is passed straight through.

The RPCs served (:data:`SERVED_RPCS`) are the ones that CLI calls for this project, as its Go code
(pkg/v3 ``host.LanguageRuntime``, ``engine/plugins.go``, ``metadata.GetLanguageRuntimeMetadata``,
``host.Close``) and a ``-v=7`` log of ``pulumi preview/up/refresh/destroy`` and of
``pulumi preview --policy-pack policy`` show:

* ``GetPluginInfo`` when the host is loaded; ``Cancel`` before it is closed;
* ``GetRequiredPackages`` before every operation (to install provider plugins);
* ``About`` for the update's metadata (``preview``/``up``);
* ``Run`` to run the program (``preview``/``up``);
* ``RunPlugin`` to start a Python policy pack (``--policy-pack DIR``).

Every other RPC answers UNIMPLEMENTED, as the generated servicer base does; the CLI treats that as
"not supported" where it can (``GetRequiredPlugins``, ``InstallDependencies``,
``RuntimeOptionsPrompts``, ``Template``), and the rest serve commands this project does not use
(``pulumi about/install/new/convert/package``, attaching to a running host).

Deliberate differences from the Go host:

* ``GetRequiredPackages`` reports no packages: the engine loads provider plugins when a resource
  needs them, instead of the CLI trying to download a plugin for every ``pulumi-*`` package
  installed in the virtualenv before each run.
* Only the ``pip`` (and ``uv``) layout of a virtualenv: no ``poetry`` toolchain, no type checker,
  no debugger attach.

Debugging: set ``PULUMI_LANGUAGE_PYTHON_LOG=/some/file`` to append the argv, every RPC called (the
unimplemented ones too) and every command started to that file (or run the CLI with ``--logflow
--logtostderr -v=5``).

Import cost matters (the CLI starts this host twice per ``pulumi up`` and waits for its port): this
module imports only the standard library, grpc and the SDK's gRPC stubs, never the rest of ale-iac
or of the Pulumi SDK.
"""

# The RPC method names (Run, GetPluginInfo, ...) are fixed by the pulumirpc proto.
# ruff: noqa: N802

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf import empty_pb2, json_format

EXEC_NAME = "pulumi-language-python-exec"
# pulumi-language-python-exec exits with this code after it has shown the user an actionable error
# (an unhandled exception in the program, say): the host then asks the engine to bail quietly.
EXIT_CODE_ERROR_ALREADY_SHOWN = 32
# Same limit as the Pulumi SDKs (pulumi.runtime.settings._MAX_RPC_MESSAGE_SIZE): resource state can
# be large.
MAX_MESSAGE_BYTES = 400 * 1024 * 1024
# Time a program gets between SIGTERM and SIGKILL when the host shuts down under it. The CLI itself
# waits 5 s after its SIGINT before it kills the whole process group.
TERMINATE_GRACE_S = 3.0
# How often the watchdog checks that the engine is still there (the Go host checks every 5 min).
PARENT_CHECK_S = 1.0
HEALTH_CHECK_S = 60.0

SERVED_RPCS = frozenset({"GetPluginInfo", "GetRequiredPackages", "About", "Run", "RunPlugin", "Cancel"})
"""The LanguageRuntime RPCs this host implements; the others answer UNIMPLEMENTED."""

_BOOL_FLAGS = frozenset({"logtostderr", "alsologtostderr", "logflow"})


# --------------------------------------------------------------------------------------- logging


class _Log:
    """Debug log to a file (PULUMI_LANGUAGE_PYTHON_LOG) and/or stderr (--logtostderr -v>=5)."""

    def __init__(self) -> None:
        self.path = os.environ.get("PULUMI_LANGUAGE_PYTHON_LOG", "")
        self.to_stderr = False
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.path) or self.to_stderr

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        now = time.time()
        stamp = f"{time.strftime('%H:%M:%S', time.localtime(now))}.{int(now * 1000) % 1000:03d}"
        line = f"{stamp} [{os.getpid()}] {message}\n"
        with self._lock:
            if self.path:
                try:
                    with open(self.path, "a", encoding="utf-8") as f:
                        f.write(line)
                except OSError:
                    pass
            if self.to_stderr:
                sys.stderr.write(line)
                sys.stderr.flush()


log = _Log()


# ---------------------------------------------------------------------------------- the gRPC stubs


def _import_stubs(*names: str) -> tuple[types.ModuleType, ...]:
    """Import the pulumirpc stubs ``pulumi.runtime.proto.<name>`` without the rest of the Pulumi SDK.

    ``import pulumi.runtime.proto`` first runs ``pulumi/__init__.py``, which pulls in the whole SDK
    (automation API, mocks, ...: ~0.1 s more before the CLI gets the port, twice per command). The
    stubs need none of it (they import each other relatively), so empty placeholder packages stand
    in for ``pulumi``, ``pulumi.runtime`` and ``pulumi.runtime.proto`` while the stubs load. Then
    the placeholders and everything imported under them are unregistered again (the stub modules
    live on in this module), so that a later ``import pulumi`` in the same process (a test) gets
    the real SDK. Any surprise falls back to the plain import.
    """

    def plain() -> tuple[types.ModuleType, ...]:
        return tuple(importlib.import_module(f"pulumi.runtime.proto.{n}") for n in names)

    if "pulumi" in sys.modules:
        return plain()
    spec = importlib.util.find_spec("pulumi")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the 'pulumi' package is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    before = set(sys.modules)
    try:
        for name in ("pulumi", "pulumi.runtime", "pulumi.runtime.proto"):
            placeholder = types.ModuleType(name)
            placeholder.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = placeholder
        return plain()
    except ImportError:
        pass
    finally:
        for name in set(sys.modules) - before:
            if name == "pulumi" or name.startswith("pulumi."):
                del sys.modules[name]
    return plain()


if TYPE_CHECKING:
    from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2
else:
    language_pb2, language_pb2_grpc, plugin_pb2 = _import_stubs("language_pb2", "language_pb2_grpc", "plugin_pb2")


# ------------------------------------------------------------------------------------- arguments


@dataclass
class HostArgs:
    engine_address: str = ""
    tracing: str = ""
    executor: str = ""
    verbose: int = 0
    log_to_stderr: bool = False


def parse_args(argv: Sequence[str]) -> HostArgs:
    """Parse Go ``flag``-style arguments: ``-x``/``--x``, ``-x=v`` or ``-x v``; stop at the first positional.

    Unknown flags are accepted (the CLI may pass more in later versions); the obsolete
    ``--virtualenv``/``--root``/``--typechecker``/``--toolchain`` flags of older hosts are ignored:
    these come from the program info of each request now.
    """
    args = HostArgs()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        name, has_value, value = arg.lstrip("-").partition("=")
        if not has_value and name not in _BOOL_FLAGS and i + 1 < len(argv):
            i += 1
            value = argv[i]
        i += 1
        if name == "tracing":
            args.tracing = value
        elif name == "use-executor":
            args.executor = value
        elif name == "v":
            try:
                args.verbose = int(value)
            except ValueError:
                args.verbose = 0
        elif name == "logtostderr":
            args.log_to_stderr = value.lower() not in {"false", "0"}
    if i < len(argv):
        args.engine_address = argv[i]
    return args


# ------------------------------------------------------------------------------- python toolchain


class ToolchainError(Exception):
    """The project's Python environment is unusable; the message is meant for the user."""


@dataclass(frozen=True)
class PythonEnv:
    """The interpreter a program or plugin runs with, and the environment that activates it."""

    python: str
    virtualenv: Path | None
    toolchain: str

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with the virtualenv activated, as Go's toolchain.ActivateVirtualEnv does."""
        env = dict(base)
        if self.virtualenv is not None:
            env.pop("PYTHONHOME", None)
            bin_dir = str(self.virtualenv / "bin")
            env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}" if env.get("PATH") else bin_dir
            env["VIRTUAL_ENV"] = str(self.virtualenv)
        return env


def runtime_options(info: language_pb2.ProgramInfo | None) -> dict[str, Any]:
    """``ProgramInfo.options`` (Pulumi.yaml ``runtime.options``) as a dict."""
    if info is None or not info.HasField("options"):
        return {}
    options: dict[str, Any] = json_format.MessageToDict(info.options)
    return options


def _string_option(options: Mapping[str, Any], key: str) -> str:
    value = options.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ToolchainError(f"the '{key}' runtime option in Pulumi.yaml must be a string, not {value!r}")
    return value


def _venv_problem(option: str, path: Path) -> str:
    what = "doesn't exist" if not path.exists() else "doesn't appear to be a virtual environment"
    return (
        f"The 'virtualenv' option in Pulumi.yaml is set to {option!r}, but {str(path)!r} {what}; "
        "run the following commands to create the virtual environment and install dependencies into it:\n\n"
        f"    1. python3 -m venv {path}\n"
        f"    2. {path}/bin/python -m pip install --upgrade pip setuptools wheel\n"
        f"    3. {path}/bin/python -m pip install -r requirements.txt\n\n"
        "(for ale-iac: ./scripts/setup.sh)"
    )


def _ambient_python() -> str:
    """``PULUMI_PYTHON_CMD``, else ``python3``, else ``python`` from PATH (Go's toolchain.CommandPath)."""
    candidates = [os.environ["PULUMI_PYTHON_CMD"]] if os.environ.get("PULUMI_PYTHON_CMD") else ["python3", "python"]
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    raise ToolchainError(f"no Python interpreter found: looked for {' and '.join(candidates)} on PATH")


def resolve_python(info: language_pb2.ProgramInfo | None, *, plugin: bool = False) -> PythonEnv:
    """Pick the interpreter for a program (or, with ``plugin``, a plugin) described by ``info``."""
    options = runtime_options(info)
    root = Path(info.root_directory or info.program_directory or os.getcwd()) if info is not None else Path.cwd()
    toolchain = _string_option(options, "toolchain") or "pip"
    if toolchain not in {"pip", "uv"}:
        raise ToolchainError(
            f"the '{toolchain}' toolchain (Pulumi.yaml runtime.options) is not supported by ale-iac's "
            "language host: use 'pip' with a 'virtualenv'"
        )
    typechecker = _string_option(options, "typechecker")
    if typechecker:
        raise ToolchainError(
            f"the '{typechecker}' typechecker (Pulumi.yaml runtime.options) is not supported by ale-iac's "
            "language host: run it yourself (ale-iac: .venv/bin/mypy)"
        )
    option = _string_option(options, "virtualenv")
    if not option and (toolchain == "uv" or plugin):
        # uv keeps its environment in .venv; plugins never run on the ambient Python (Go host).
        option = ".venv" if toolchain == "uv" else "venv"
    if not option:
        return PythonEnv(_ambient_python(), None, toolchain)
    venv = Path(option) if os.path.isabs(option) else root / option
    python = venv / "bin" / "python"
    if not python.is_file():
        raise ToolchainError(_venv_problem(option, venv))
    # Not resolved: a venv's bin/python is a symlink, and following it would lose the venv.
    return PythonEnv(str(python), venv, toolchain)


def find_executor(explicit: str) -> str:
    """pulumi-language-python-exec: --use-executor, else beside this host or the CLI, else on PATH."""
    if explicit:
        return explicit
    here = Path(sys.argv[0])
    dirs = [here.parent, Path(os.path.realpath(here)).parent]
    cli = shutil.which("pulumi")
    if cli:
        dirs += [Path(cli).parent, Path(os.path.realpath(cli)).parent]
    for d in dirs:
        candidate = d / EXEC_NAME
        if candidate.is_file():
            return str(candidate)
    on_path = shutil.which(EXEC_NAME)
    if on_path:
        return on_path
    searched = ", ".join(dict.fromkeys(str(d) for d in dirs))
    raise ToolchainError(f"missing executor {EXEC_NAME}: not in {searched} nor on PATH")


def plugin_target(info: language_pb2.ProgramInfo | None) -> str:
    """The plugin directory to run (a policy pack: PulumiPolicy.yaml + __main__.py)."""
    plugin_dir = Path(info.program_directory or info.root_directory) if info is not None else Path.cwd()
    if not (plugin_dir / "__main__.py").is_file():
        raise ToolchainError(f"plugin in {plugin_dir} is not runnable: it has no __main__.py")
    return str(plugin_dir)


# ---------------------------------------------------------------------------------- the service


def _exit_error(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"program exited unexpectedly: {name}"
    return f"program exited with non-zero exit code: {code}"


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)  # raises
    raise AssertionError("unreachable: ServicerContext.abort returned")


def _info(request: Any) -> language_pb2.ProgramInfo | None:
    info: language_pb2.ProgramInfo | None = request.info if request.HasField("info") else None
    return info


def _plugin_command(
    request: language_pb2.RunPluginRequest, info: language_pb2.ProgramInfo | None, context: grpc.ServicerContext
) -> tuple[list[str], dict[str, str]]:
    """The plugin's command line (its Python, unbuffered, on its main module) and environment (ours, plus
    the request's, in the Python environment's shape)."""
    try:
        py = resolve_python(info, plugin=True)
        argv = [py.python, "-u", plugin_target(info), *request.args]
    except ToolchainError as exc:
        _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    base = dict(os.environ)
    for entry in request.env:
        key, _, value = entry.partition("=")
        base[key] = value
    return argv, py.environ(base)


def _plugin_output(proc: subprocess.Popen[bytes]) -> Iterator[language_pb2.RunPluginResponse]:
    """What the plugin writes to stdout and stderr, as it comes, until both are closed (one thread reads each:
    a plugin that fills one pipe while we wait on the other would hang)."""
    chunks: list[tuple[str, bytes]] = []
    ready = threading.Condition()
    open_streams = 2

    def pump(name: str, stream: IO[bytes]) -> None:
        nonlocal open_streams
        while chunk := os.read(stream.fileno(), 65536):
            with ready:
                chunks.append((name, chunk))
                ready.notify()
        with ready:
            open_streams -= 1
            ready.notify()

    if proc.stdout is None or proc.stderr is None:  # pragma: no cover - both are pipes
        raise RuntimeError("plugin started without pipes")
    for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        threading.Thread(target=pump, args=(name, stream), daemon=True).start()
    while True:
        with ready:
            while not chunks and open_streams:
                ready.wait()
            pending, chunks[:] = list(chunks), []
            finished = open_streams == 0
        for name, chunk in pending:
            yield (
                language_pb2.RunPluginResponse(stdout=chunk)
                if name == "stdout"
                else language_pb2.RunPluginResponse(stderr=chunk)
            )
        if finished:
            return


class LanguageHost(language_pb2_grpc.LanguageRuntimeServicer):
    """The pulumirpc.LanguageRuntime service for Python programs: the RPCs of :data:`SERVED_RPCS`.

    The generated base class answers UNIMPLEMENTED for every RPC not overridden here.
    """

    def __init__(self, args: HostArgs, version: str = "") -> None:
        self.args = args
        self.version = version
        self.engine_address = args.engine_address
        self._children: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    # -- child processes --------------------------------------------------------------------

    def _start(self, argv: list[str], *, env: Mapping[str, str], cwd: str | None, **kw: Any) -> subprocess.Popen[bytes]:
        log(f"starting (cwd={cwd}): {' '.join(argv)}")
        proc = subprocess.Popen(argv, env=dict(env), cwd=cwd, **kw)
        with self._lock:
            self._children.add(proc)
        return proc

    def _forget(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._children.discard(proc)

    def terminate_children(self) -> None:
        """SIGTERM every running program/plugin, SIGKILL what is left after TERMINATE_GRACE_S."""
        with self._lock:
            children = list(self._children)
        for proc in children:
            if proc.poll() is None:
                log(f"terminating pid {proc.pid}")
                proc.terminate()
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for proc in children:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log(f"killing pid {proc.pid}")
                proc.kill()

    @staticmethod
    def _stop_on_cancel(proc: subprocess.Popen[bytes], *, kill: bool) -> Callable[[], None]:
        def stop() -> None:
            if proc.poll() is None:
                log(f"{'killing' if kill else 'terminating'} pid {proc.pid} (call cancelled)")
                if kill:
                    proc.kill()
                else:
                    proc.terminate()

        return stop

    # -- RPCs ---------------------------------------------------------------------------------

    def GetPluginInfo(self, request: empty_pb2.Empty, context: grpc.ServicerContext) -> plugin_pb2.PluginInfo:
        return plugin_pb2.PluginInfo(version=self.version)

    def GetRequiredPackages(
        self, request: language_pb2.GetRequiredPackagesRequest, context: grpc.ServicerContext
    ) -> language_pb2.GetRequiredPackagesResponse:
        # Deliberately empty, see the module docstring: providers are loaded on first use.
        return language_pb2.GetRequiredPackagesResponse()

    def About(self, request: language_pb2.AboutRequest, context: grpc.ServicerContext) -> language_pb2.AboutResponse:
        try:
            py = resolve_python(_info(request))
            proc = subprocess.run(
                # -S: skip site (and its .pth files): sys.executable and the version do not need it.
                [py.python, "-S", "-c", "import sys; print(sys.executable); print(sys.version.split()[0])"],
                env=py.environ(os.environ),
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            )
        except (ToolchainError, OSError, subprocess.SubprocessError) as exc:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"cannot describe the Python interpreter: {exc}")
        executable, _, version = proc.stdout.strip().partition("\n")
        return language_pb2.AboutResponse(
            executable=executable, version=version, metadata={"toolchain": py.toolchain, "host": "ale-iac (Python)"}
        )

    def run_argv(self, request: language_pb2.RunRequest, py: PythonEnv, executor: str) -> list[str]:
        """The pulumi-language-python-exec command line for ``request``, as the Go host builds it."""
        info = _info(request)
        flags = [
            ("monitor", request.monitor_address),
            ("engine", self.engine_address),
            ("project", request.project),
            ("root_directory", info.root_directory if info else ""),
            ("stack", request.stack),
            ("pwd", request.pwd),
            ("dry_run", "true" if request.dryRun else "false"),
            ("parallel", str(request.parallel)),
            ("tracing", self.args.tracing),
            ("organization", request.organization),
        ]
        argv = [py.python, "-u", executor]
        for name, value in flags:
            if value:
                argv += [f"--{name}", value]
        # The engine always sends an entry point ("." for the program directory); `program` is the
        # pre-ProgramInfo spelling.
        argv.append((info.entry_point if info else "") or request.program or ".")
        argv += list(request.args)
        return argv

    def Run(self, request: language_pb2.RunRequest, context: grpc.ServicerContext) -> language_pb2.RunResponse:
        info = _info(request)
        log(
            f"Run project={request.project} stack={request.stack} dry_run={request.dryRun} "
            f"pwd={request.pwd} entry={info.entry_point if info else request.program!r}"
        )
        if request.attach_debugger:
            return language_pb2.RunResponse(error="attaching a debugger is not supported by this language host")
        try:
            py = resolve_python(info)
            argv = self.run_argv(request, py, find_executor(self.args.executor))
        except ToolchainError as exc:
            return language_pb2.RunResponse(error=str(exc))
        env = py.environ(os.environ)
        # Read by pulumi.runtime.get_config_env / get_config_secret_keys_env in the program.
        env["PULUMI_CONFIG"] = json.dumps(dict(request.config))
        env["PULUMI_CONFIG_SECRET_KEYS"] = json.dumps(list(request.configSecretKeys))
        cwd = request.pwd or (info.program_directory if info else "") or None
        # stdout/stderr are inherited: the CLI shows what the program prints (tracebacks included).
        try:
            proc = self._start(argv, env=env, cwd=cwd)
        except OSError as exc:
            return language_pb2.RunResponse(error=f"problem executing program (could not run language executor): {exc}")
        # If the CLI gives up on the call (cancellation), do not leave the program behind.
        context.add_callback(self._stop_on_cancel(proc, kill=False))
        try:
            code = proc.wait()
        finally:
            self._forget(proc)
        log(f"program exited with {code}")
        if code == 0:
            return language_pb2.RunResponse()
        if code == EXIT_CODE_ERROR_ALREADY_SHOWN:
            return language_pb2.RunResponse(bail=True)
        return language_pb2.RunResponse(error=_exit_error(code))

    def RunPlugin(
        self, request: language_pb2.RunPluginRequest, context: grpc.ServicerContext
    ) -> Iterator[language_pb2.RunPluginResponse]:
        """Run a Python plugin (a policy pack) and stream its output; the last message has its exit code."""
        info = _info(request)
        log(f"RunPlugin kind={request.kind} dir={info.program_directory if info else ''} args={list(request.args)}")
        if request.attach_debugger:
            _abort(context, grpc.StatusCode.UNIMPLEMENTED, "attaching a debugger is not supported by this host")
        argv, env = _plugin_command(request, info, context)
        try:
            proc = self._start(
                argv,
                env=env,
                cwd=request.pwd or None,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            _abort(context, grpc.StatusCode.INTERNAL, f"problem executing plugin program: {exc}")
        # The CLI cancels the stream to stop the plugin (the Go host kills it, too).
        context.add_callback(self._stop_on_cancel(proc, kill=True))
        try:
            yield from _plugin_output(proc)
            code = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self._forget(proc)
        log(f"plugin exited with {code}")
        yield language_pb2.RunPluginResponse(exitcode=code if code >= 0 else 128 - code)

    def Cancel(self, request: empty_pb2.Empty, context: grpc.ServicerContext) -> empty_pb2.Empty:
        threading.Thread(target=self.terminate_children, daemon=True).start()
        return empty_pb2.Empty()


# --------------------------------------------------------------------------------------- serving


class _LogCalls(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc has no type hints
    """Logs the name of every RPC called, implemented or not (only installed when logging)."""

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        log(f"rpc {handler_call_details.method}")
        return continuation(handler_call_details)


def start_server(host: LanguageHost) -> tuple[grpc.Server, int]:
    """Serve ``host`` on a free port of 127.0.0.1; returns the started server and its port."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="rpc"),
        interceptors=[_LogCalls()] if log.enabled else None,
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(host, server)
    port = server.add_insecure_port("127.0.0.1:0")
    if not port:
        raise OSError("could not listen on a local port")
    server.start()
    return server, int(port)


def _engine_alive(channel: grpc.Channel) -> bool:
    """grpc.health.v1.Health/Check on the engine; UNIMPLEMENTED counts as alive (as in Go's rpcutil)."""
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=lambda _: b"",  # an empty HealthCheckRequest
        response_deserializer=lambda raw: raw,
    )
    try:
        check(None, timeout=10)
    except grpc.RpcError as exc:
        return bool(exc.code() == grpc.StatusCode.UNIMPLEMENTED)
    return True


def _watchdog(host: LanguageHost, shutdown: threading.Event) -> None:
    """Stop when the engine is gone, so that a crashed CLI does not leave this host (and its program) behind."""
    parent = os.getppid()
    channel = None
    last_health = time.monotonic()
    while not shutdown.wait(PARENT_CHECK_S):
        # Started by the CLI: being re-parented means the CLI has died.
        if host.args.engine_address and os.getppid() != parent:
            log("parent process gone; shutting down")
            shutdown.set()
            return
        if host.engine_address and time.monotonic() - last_health >= HEALTH_CHECK_S:
            last_health = time.monotonic()
            channel = channel or grpc.insecure_channel(host.engine_address)
            if not _engine_alive(channel):
                log("engine health check failed; shutting down")
                shutdown.set()
                return


def _pinned_version() -> str:
    """PULUMI_VERSION of versions.env, for a host started without the version of the CLI beside it."""
    from ale_iac.errors import AleIacError
    from ale_iac.toolchain import pins

    try:
        return pins().pulumi
    except AleIacError:
        return ""


def main(argv: Sequence[str] | None = None, *, version: str = "") -> int:
    """Run the language host until SIGINT/SIGTERM or until the engine goes away.

    ``version`` is what GetPluginInfo reports: the version of the CLI this host is installed beside
    (the launcher has it from scripts/build-pulumi.sh); empty means the pinned PULUMI_VERSION.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    log.to_stderr = args.log_to_stderr and args.verbose >= 5
    log(f"argv={list(sys.argv)} cwd={os.getcwd()} python={sys.executable}")

    shutdown = threading.Event()
    # The CLI stops plugins with SIGINT to their process group (SIGKILL 5 s later).
    # The handler only starts a thread: Event.set() takes a lock that the interrupted main thread
    # may be holding (it waits on the same Event), and handlers run on the main thread.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: threading.Thread(target=shutdown.set, daemon=True).start())

    host = LanguageHost(args, version or _pinned_version())
    try:
        server, port = start_server(host)
    except OSError as exc:
        sys.stderr.write(f"pulumi-language-python: {exc}\n")
        return 1
    # The CLI reads the port from the first line of stdout.
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    log(f"serving on 127.0.0.1:{port}")

    threading.Thread(target=_watchdog, args=(host, shutdown), daemon=True).start()
    shutdown.wait()
    log("shutting down")
    stopped = server.stop(grace=1.0)
    host.terminate_children()
    stopped.wait(2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
