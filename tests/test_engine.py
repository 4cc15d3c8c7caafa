"""The Automation API seam against the real Pulumi CLI and the local file backend."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime import _grpc_settings
from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc

from ale_iac.engine import (
    LOG_ROTATION_MAX_TOTAL_MB,
    SHARED_WITH_USER_HOME,
    Engine,
    StackLockedError,
    StackNotFoundError,
    StackOperationError,
    engine_message,
    ensure_pulumi_home,
    sweep_orphan_providers,
    workspace_settings_file,
)
from ale_iac.errors import one_line
from ale_iac.toolchain import PulumiNotFoundError, PulumiTooOldError, find_toolchain, probe
from tests.support.engine import failing_program, marker_program

REPO = Path(__file__).resolve().parent.parent


def _work_dirs(engine: Engine) -> list[Path]:
    return list((engine.home / "work").iterdir())


@pytest.mark.engine
def test_dynamic_resource_stack_goes_up_exports_and_is_destroyed(tmp_path: Path) -> None:
    engine = Engine()
    target = tmp_path / "marker.txt"
    outputs = engine.up("t-one", marker_program(str(target), "hello"))
    assert outputs["path"] == str(target)
    assert outputs["size"] == 5
    assert outputs["secret"] == "s3cr3t-hello"
    assert target.read_text() == "hello"
    assert engine.outputs("t-one")["size"] == 5
    assert [s.name for s in engine.list_stacks()] == ["t-one"]
    # The engine's log has the run, and the secret output is masked there.
    log = engine.log_path("t-one").read_text()
    assert "pulumi up" in log and "s3cr3t-hello" not in log

    engine.destroy("t-one")
    assert not target.exists()
    assert engine.list_stacks() == []
    with pytest.raises(StackNotFoundError):
        engine.outputs("t-one")
    assert _work_dirs(engine) == []


def _pulumi_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A Pulumi home of the test's own (its CLI calls record selected stacks and write logs there)."""
    home = tmp_path / "pulumi-home"
    home.mkdir()
    monkeypatch.setenv("PULUMI_HOME", str(home))
    return home


def _workspace_files(pulumi_home: Path) -> list[str]:
    return (
        sorted(p.name for p in (pulumi_home / "workspaces").glob("*")) if (pulumi_home / "workspaces").exists() else []
    )


@pytest.mark.engine
def test_operations_leave_no_selected_stack_record_in_the_pulumi_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every operation runs in a folder of its own, where the CLI's ``stack select`` / ``stack init`` record
    the stack they chose in a file of the Pulumi home named by that folder: removed with the folder, or one file
    per operation would pile up there for good."""
    pulumi_home = _pulumi_home(monkeypatch, tmp_path)
    engine = Engine()
    engine.init("t-ws")
    engine.up("t-ws", marker_program(str(tmp_path / "m"), "x"))
    assert engine.outputs("t-ws")["size"] == 1
    engine.destroy("t-ws")
    assert (pulumi_home / "logs").is_dir()  # the CLI did use this home
    assert _workspace_files(pulumi_home) == []
    assert _work_dirs(engine) == []


def _user_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A user's home of the test's own, whose ``~/.pulumi`` the engine must leave alone; no ``PULUMI_HOME``."""
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PULUMI_HOME", raising=False)
    return home


@pytest.mark.engine
def test_the_cli_s_logs_go_to_ale_iac_s_own_pulumi_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    user = _user_home(monkeypatch, tmp_path)
    engine = Engine()
    assert engine.pulumi_home == engine.home / "pulumi"
    assert engine.env_vars()["PULUMI_HOME"] == str(engine.pulumi_home)
    engine.init("t-logs")
    engine.destroy("t-logs")
    assert len(list((engine.pulumi_home / "logs").glob("*.log"))) >= 2  # stack init, destroy
    assert not (user / ".pulumi").exists()
    # A PULUMI_HOME of the caller's is the CLI's, rotated as the CLI does by default.
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "theirs"))
    assert Engine().pulumi_home == tmp_path / "theirs"
    assert "PULUMI_LOG_ROTATION_MAX_TOTAL_MB" not in Engine().env_vars()


@pytest.mark.engine
def test_the_cli_rotates_its_logs_in_ale_iac_s_pulumi_home_at_the_cap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cap is the CLI's to apply (``PULUMI_LOG_ROTATION_MAX_TOTAL_MB``): logs of the last hours, 1 MB each and
    three times the cap in all, are cut to the cap by the next CLI call, the oldest first."""
    _user_home(monkeypatch, tmp_path)
    engine = Engine()
    logs = engine.pulumi_home / "logs"
    logs.mkdir(parents=True)
    now = datetime.datetime.now()
    names = [
        f"pulumi-{(now - datetime.timedelta(minutes=5 + i)).strftime('%Y%m%dT%H%M%S')}-{1000 + i}-version.log"
        for i in range(3 * LOG_ROTATION_MAX_TOTAL_MB)
    ]
    for name in names:
        (logs / name).write_bytes(b"\0" * 2**20)
    engine.init("t-rotate")
    engine.remove("t-rotate")
    kept = {p.name for p in logs.glob("pulumi-*-version.log")}
    assert 0 < len(kept) <= LOG_ROTATION_MAX_TOTAL_MB
    assert kept == set(names[: len(kept)])  # the newest kept


def test_ale_iac_s_pulumi_home_shares_the_user_s_plugins_and_login(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    user = _user_home(monkeypatch, tmp_path)
    ours = tmp_path / "ale-home" / "pulumi"
    ensure_pulumi_home(ours)  # the user has neither yet: nothing to link
    assert sorted(p.name for p in ours.iterdir()) == []
    (ours / "plugins").mkdir()  # as the CLI makes it when it installs a plugin
    (user / ".pulumi" / "plugins").mkdir(parents=True)
    (user / ".pulumi" / "credentials.json").write_text("{}")
    ensure_pulumi_home(ours)
    assert not (ours / "plugins").is_symlink()  # a folder of its own stays as it is
    assert (ours / "credentials.json").resolve() == user / ".pulumi" / "credentials.json"
    fresh = tmp_path / "fresh" / "pulumi"
    ensure_pulumi_home(fresh)
    ensure_pulumi_home(fresh)  # again: the links are there already
    for name in SHARED_WITH_USER_HOME:
        assert (fresh / name).is_symlink() and (fresh / name).resolve() == user / ".pulumi" / name


def test_the_selected_stack_record_is_where_the_cli_writes_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pulumi_home = _pulumi_home(monkeypatch, tmp_path)
    engine = Engine()
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: ale-iac\nruntime: python\n")
    env = {**os.environ, **engine.env_vars()}
    pulumi = str(engine.toolchain.pulumi)
    subprocess.run([pulumi, "stack", "init", "t-rec", "--cwd", str(project)], env=env, check=True, capture_output=True)
    try:
        assert _workspace_files(pulumi_home) == [workspace_settings_file(project, engine.pulumi_home).name]
        assert workspace_settings_file(project, engine.pulumi_home).parent == pulumi_home / "workspaces"
    finally:
        subprocess.run([pulumi, "stack", "rm", "--yes", "-s", "t-rec", "--cwd", str(project)], env=env, check=False)


def test_a_cli_call_and_its_plugins_write_temp_files_into_the_operation_s_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plugin's temp files (the Kubernetes provider copies the kubeconfig into one on every call and never
    removes it) go with the operation: its CLI call's ``TMPDIR`` is inside the work dir removed after it. Here the
    plugin is the Python language host running a project's program, which makes a temp file and says where."""
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(machine_tmp))
    _pulumi_home(monkeypatch, tmp_path)
    engine = Engine()
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text((REPO / "Pulumi.yaml").read_text().replace("main: .\n", ""))
    where = tmp_path / "where"
    (project / "__main__.py").write_text(
        f"import tempfile\nfd, name = tempfile.mkstemp(prefix='plugin-')\nopen({str(where)!r}, 'w').write(name)\n"
    )
    (project / ".venv").symlink_to(REPO / ".venv")
    pulumi = str(engine.toolchain.pulumi)
    env = {**os.environ, **engine.env_vars()}
    subprocess.run([pulumi, "stack", "init", "t-tmp", "--cwd", str(project)], env=env, check=True, capture_output=True)
    try:
        engine.run_in_project("t-tmp", project, ["preview", "--non-interactive", "--stack", "t-tmp"], "preview")
    finally:
        subprocess.run([pulumi, "stack", "rm", "--yes", "-s", "t-tmp", "--cwd", str(project)], env=env, check=False)
    made = Path(where.read_text())
    assert made.parent.parent.parent == engine.home / "work", made  # <home>/work/<operation>/tmp/plugin-*
    assert not made.exists()
    assert list(machine_tmp.iterdir()) == []
    assert _work_dirs(engine) == []


@pytest.mark.engine
def test_four_stacks_in_parallel_threads_keep_their_own_outputs(tmp_path: Path) -> None:
    engine = Engine()

    def one(i: int) -> tuple[int, object]:
        out = engine.up(f"t-par-{i}", marker_program(str(tmp_path / f"m{i}"), "x" * (i + 1)))
        engine.destroy(f"t-par-{i}")
        return i, out["size"]

    with ThreadPoolExecutor(4) as pool:
        results = dict(pool.map(one, range(4)))
    assert results == {0: 1, 1: 2, 2: 3, 3: 4}
    assert engine.list_stacks() == []
    assert list(tmp_path.iterdir()) == []
    assert _work_dirs(engine) == []


@pytest.mark.engine
def test_up_failure_carries_the_engine_message(tmp_path: Path) -> None:
    engine = Engine()

    def broken() -> None:
        raise ValueError("the program is broken on purpose")

    with pytest.raises(Exception) as info:
        engine.up("t-broken", broken)
    assert "broken on purpose" in str(info.value)
    engine.destroy("t-broken")
    assert _work_dirs(engine) == []


DRIVER = textwrap.dedent(
    """
    import sys
    from ale_iac.engine import Engine
    from tests.support.engine import marker_program
    Engine().up("t-killed", marker_program(sys.argv[1], "doomed", hold_s=120))
    """
)


@pytest.mark.engine
def test_killed_up_leaves_a_locked_stack_that_recover_cleans(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pulumi_home = _pulumi_home(monkeypatch, tmp_path)
    target = tmp_path / "m"
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(target)],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    creating = Path(str(target) + ".creating")
    deadline = time.monotonic() + 120
    while not creating.exists():
        assert proc.poll() is None, "driver exited before the create started"
        assert time.monotonic() < deadline, "create never started"
        time.sleep(0.1)
    # Kill the driver, the pulumi CLI it started and its provider process (ale_iac.provider_host, in
    # the driver's process group, inside its create): nothing gets to clean up.
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(_workspace_files(pulumi_home)) == 1  # its operation's record of the stack it selected

    engine = Engine()
    assert engine.is_locked("t-killed")
    assert sweep_orphan_providers() == []  # no provider outlived its engine
    with pytest.raises(StackLockedError, match="ale-iac gc"):
        engine.up("t-killed", marker_program(str(target), "again"))
    engine.recover("t-killed")
    assert engine.list_stacks() == []
    assert not engine.is_locked("t-killed")
    assert _work_dirs(engine) == []  # the killed process's work dir was swept
    assert _workspace_files(pulumi_home) == []  # and the CLI's record of its selected stack with it


def test_missing_cli_gives_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALE_IAC_PULUMI", str(tmp_path / "nope" / "pulumi"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("ALE_IAC_CACHE", str(tmp_path / "empty-cache"))
    find_toolchain.cache_clear()
    try:
        with pytest.raises(PulumiNotFoundError) as info:
            find_toolchain()
    finally:
        find_toolchain.cache_clear()
    message = str(info.value)
    assert "Pulumi CLI not found" in message and "scripts/setup.sh" in message and ">= 3.181" in message


def test_too_old_cli_is_refused(tmp_path: Path) -> None:
    # A version-only stand-in: the version gate is all that is exercised here (the real CLI is newer).
    old = tmp_path / "bin" / "pulumi"
    old.parent.mkdir()
    old.write_text("#!/bin/sh\necho v3.100.0\n")
    old.chmod(0o755)
    with pytest.raises(PulumiTooOldError, match=r"older than the 3\.181\.0"):
        probe(old)


@pytest.mark.engine
def test_real_cli_is_recent_enough() -> None:
    toolchain = find_toolchain()
    assert toolchain.dynamic_launcher is not None
    assert probe(toolchain.pulumi).version == toolchain.version


def test_engine_message_keeps_error_lines() -> None:
    class FakeError(Exception):
        stderr = "noise\nerror: the real reason\nmore noise"
        stdout = ""

    assert engine_message(FakeError()) == "error: the real reason"


DOCKER_400 = (
    "docker unit u-1: 400 Client Error for http+docker://localhost/v1.51/containers/create: Bad Request "
    '("Range of CPUs is from 0.01 to 2.00, as there are only 2 CPUs available")'
)


def test_engine_message_of_a_provider_traceback_is_its_exception() -> None:
    """A dynamic provider that raised: the engine's diagnostic is a traceback; what a person needs is its
    last line (the exception), not its first, and not the engine's own ``update failed``."""

    class FakeError(Exception):
        stderr = ""
        stdout = "\n".join(
            [
                " +  pulumi-python:dynamic:Resource u-1 creating (0s) error: Traceback (most recent call last):",
                "Diagnostics:",
                "  pulumi:pulumi:Stack (ale-iac-run-1):",
                "    error: update failed",
                "",
                "  pulumi-python:dynamic:Resource (u-1):",
                "    error: Traceback (most recent call last):",
                '      File "/x/pulumi/dynamic/__main__.py", line 170, in Create',
                "        result = provider.create(props)",
                "                 ^^^^^^^^^^^^^^^^^^^^^^",
                f"    ale_iac.substrates.docker.runtime.DockerSubstrateError: {DOCKER_400}",
                "",
                "Resources:",
                "    2 errored",
            ]
        )

    assert engine_message(FakeError()) == f"DockerSubstrateError: {DOCKER_400}"


def test_engine_message_leaves_out_the_program_ending_with_the_update() -> None:
    """When a provider fails, the program's side may also say that the engine ended it, before the
    provider's diagnostic or not at all (a race): that line says nothing of why and is left out."""

    class FakeError(Exception):
        stderr = ""
        stdout = "\n".join(
            [
                "Diagnostics:",
                "  pulumi:pulumi:Stack (ale-iac-run-1):",
                "    error: Resource monitor has terminated, shutting down",
                "    error: update failed",
                "",
                "  pulumi-python:dynamic:Resource (u-1):",
                "    error: Traceback (most recent call last):",
                '      File "/x/pulumi/dynamic/__main__.py", line 170, in Create',
                f"    ale_iac.errors.AleIacError: {DOCKER_400}",
                "",
            ]
        )

    assert engine_message(FakeError()) == f"AleIacError: {DOCKER_400}"


@pytest.mark.engine
def test_a_provider_that_raises_fails_the_up_with_its_exception(tmp_path: Path) -> None:
    engine = Engine()
    with pytest.raises(StackOperationError) as info:
        engine.up("t-provider-raises", failing_program(DOCKER_400))
    engine.destroy("t-provider-raises")
    assert info.value.engine_message == f"AleIacError: {DOCKER_400}"
    assert one_line(info.value) == f"pulumi up of stack 't-provider-raises' failed: AleIacError: {DOCKER_400}"


@pytest.mark.engine
def test_pulumi_preview_on_the_project_with_a_shipped_stack(tmp_path: Path) -> None:
    """`pulumi preview` on Pulumi.yaml (the language host path) with the static stack's config."""
    engine = Engine()
    project = tmp_path / "project"
    (project / "stacks").mkdir(parents=True)
    for name in ("Pulumi.yaml", "__main__.py"):
        (project / name).write_text((REPO / name).read_text())
    (project / "stacks" / "Pulumi.static.yaml").write_text((REPO / "stacks" / "Pulumi.static.yaml").read_text())
    (project / ".venv").symlink_to(REPO / ".venv")
    env = {**os.environ, **engine.env_vars()}
    pulumi = str(engine.toolchain.pulumi)
    subprocess.run([pulumi, "stack", "init", "static", "--cwd", str(project)], env=env, check=True, capture_output=True)
    try:
        out = subprocess.run(
            [pulumi, "preview", "--diff", "--non-interactive", "-s", "static", "--cwd", str(project)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "units" in out.stdout and "http://127.0.0.1:8000" in out.stdout
    finally:
        subprocess.run([pulumi, "stack", "rm", "--yes", "-s", "static", "--cwd", str(project)], env=env, check=False)


class _EngineLog(engine_pb2_grpc.EngineServicer):
    """The CLI's engine service as far as a program's log calls need it: a place to send them to."""

    def Log(self, request: engine_pb2.LogRequest, context: object) -> empty_pb2.Empty:  # noqa: N802 (grpc's name)
        del request, context
        return empty_pb2.Empty()


def _serve_engine(port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    engine_pb2_grpc.add_EngineServicer_to_server(_EngineLog(), server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    assert bound, f"port {port} is not free"
    server.start()
    return server, bound


def _log_via(channel: grpc.Channel) -> None:
    engine_pb2_grpc.EngineStub(channel).Log(engine_pb2.LogRequest(severity=engine_pb2.DEBUG, message="m"), timeout=30)


def test_a_program_reaches_its_engine_on_a_port_an_earlier_programs_dead_engine_had() -> None:
    """A program opens its channels to the CLI (``pulumi.runtime.settings.Settings``: these options) in
    this process; an earlier one whose CLI is gone (killed, say) left a refused connection to the port its
    engine had. When the kernel gives that port to a later CLI's engine, the later program's first call
    reaches it, instead of failing at once with the earlier "connection refused" (grpc's process-wide
    connection sharing, which ``ale_iac.engine`` turns off for these channels)."""
    first, port = _serve_engine()
    address = f"127.0.0.1:{port}"
    earlier = grpc.insecure_channel(address, options=_grpc_settings._GRPC_CHANNEL_OPTIONS)
    try:
        _log_via(earlier)
        first.stop(None).wait()  # the earlier CLI is killed
        with pytest.raises(grpc.RpcError) as refused:
            _log_via(earlier)  # its program still logs ("Resource monitor has terminated")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        later_cli, _ = _serve_engine(port)
        later = grpc.insecure_channel(address, options=_grpc_settings._GRPC_CHANNEL_OPTIONS)
        try:
            _log_via(later)
        finally:
            later.close()
            later_cli.stop(None).wait()
    finally:
        earlier.close()
