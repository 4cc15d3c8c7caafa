"""The Python language host (ale_iac/langhost.py), its launcher and the versions file.

The host is exercised over real gRPC, in process, with a stand-in for pulumi-language-python-exec
that records what it was started with; the launcher as scripts/build-pulumi.sh installs it (into a
throwaway cache with a fake CLI, so the real toolchain is never touched). The real CLI driving the
host is covered by tests/test_engine.py (``pulumi preview`` on Pulumi.yaml), tests/runner/test_pool.py
(``pulumi up``) and tests/infra/test_cloud_policy_cli.py (a policy pack through RunPlugin).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2, message_factory, struct_pb2

from ale_iac import langhost
from ale_iac.toolchain import VersionsFileError, parse_versions, pins, read_pins, versions_file

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "scripts" / "pulumi-language-python"
SERVICE = langhost.language_pb2.DESCRIPTOR.services_by_name["LanguageRuntime"]

pb = langhost.language_pb2


# -------------------------------------------------------------------------------- versions file


def test_bash_and_python_read_the_same_pins() -> None:
    script = 'set -eu; source "$1"; for k in PULUMI_VERSION PULUMI_MIN_VERSION GO_MIN_VERSION; do echo "$k=${!k}"; done'
    out = subprocess.run(
        ["bash", "-c", script, "bash", str(versions_file())], capture_output=True, text=True, check=True
    ).stdout
    from_bash = dict(line.split("=", 1) for line in out.splitlines())
    assert from_bash == {
        "PULUMI_VERSION": pins().pulumi,
        "PULUMI_MIN_VERSION": pins().pulumi_min,
        "GO_MIN_VERSION": pins().go_min,
    }
    # Every assignment of the file, not just the three pins, reads the same in both.
    names = parse_versions(versions_file().read_text())
    dump = 'set -eu; source "$1"; shift; for k in "$@"; do echo "$k=${!k}"; done'
    out = subprocess.run(
        ["bash", "-c", dump, "bash", str(versions_file()), *names], capture_output=True, text=True, check=True
    ).stdout
    assert dict(line.split("=", 1) for line in out.splitlines()) == names


def test_the_versions_file_is_found_from_the_package() -> None:
    assert versions_file() == REPO / "versions.env"
    assert pins().pulumi_min_tuple >= (3, 181, 0)


@pytest.mark.parametrize(
    "line",
    [
        'PULUMI_VERSION="3.1.0"',
        "PULUMI_VERSION=3.1.0 # pin",
        "PULUMI_VERSION=$OTHER",
        "export PULUMI_VERSION=3.1.0",
        "A = 1",
    ],
)
def test_lines_bash_might_read_otherwise_are_refused(line: str) -> None:
    with pytest.raises(VersionsFileError, match=r"versions\.env:2:"):
        parse_versions(f"# comment\n{line}\n")


def test_a_versions_file_must_set_every_pin(tmp_path: Path) -> None:
    path = tmp_path / "versions.env"
    path.write_text("PULUMI_VERSION=3.274.1\n\n  # indented comment\nGO_MIN_VERSION=1.26.6\n")
    with pytest.raises(VersionsFileError, match="sets no PULUMI_MIN_VERSION"):
        read_pins(path)
    path.write_text("PULUMI_VERSION=latest\nPULUMI_MIN_VERSION=3.181.0\nGO_MIN_VERSION=1.26.6\n")
    with pytest.raises(VersionsFileError, match="PULUMI_VERSION=latest is not a version"):
        read_pins(path)
    with pytest.raises(VersionsFileError, match="pip install -e"):
        read_pins(tmp_path / "missing.env")


def test_no_pin_is_repeated_in_code() -> None:
    """The pins live in versions.env only; code reads them from there (docs may quote them)."""
    code = [LAUNCHER, *(REPO / "scripts").glob("*.sh"), *(REPO / "ale_iac").rglob("*.py")]
    for value in (pins().pulumi, pins().pulumi_min, pins().pulumi_min.rsplit(".", 1)[0], pins().go_min):
        found = [str(p.relative_to(REPO)) for p in code if value in p.read_text(encoding="utf-8")]
        assert found == [], f"pin {value} repeated in {found}"


# ------------------------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["127.0.0.1:1234"], langhost.HostArgs(engine_address="127.0.0.1:1234")),
        (
            ["--logtostderr", "-v=5", "--tracing", "http://t", "127.0.0.1:1"],
            langhost.HostArgs("127.0.0.1:1", tracing="http://t", verbose=5, log_to_stderr=True),
        ),
        (["-use-executor=/x/exec", "--root", "/ignored", "addr"], langhost.HostArgs("addr", executor="/x/exec")),
        (["-v", "nine", "--logtostderr=false", "--", "-addr"], langhost.HostArgs("-addr")),
        ([], langhost.HostArgs()),
    ],
)
def test_parse_args_reads_go_style_flags(argv: list[str], expected: langhost.HostArgs) -> None:
    assert langhost.parse_args(argv) == expected


# --------------------------------------------------------------------------- the service in process


@dataclass
class Host:
    stub: Any
    host: langhost.LanguageHost
    fake_venv: Path
    record: Path


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    """The host on a local port, with a fake virtualenv and a fake pulumi-language-python-exec."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    executor = tmp_path / "fake-exec.py"
    executor.write_text(
        "import json, os, sys, time\n"
        "record = {'argv': sys.argv[1:], 'cwd': os.getcwd(), 'venv': os.environ.get('VIRTUAL_ENV'),\n"
        "          'config': json.loads(os.environ['PULUMI_CONFIG']),\n"
        "          'secret_keys': json.loads(os.environ['PULUMI_CONFIG_SECRET_KEYS'])}\n"
        "with open(os.environ['FAKE_EXEC_RECORD'], 'w') as f:\n"
        "    json.dump(record, f)\n"
        "time.sleep(float(os.environ.get('FAKE_EXEC_SLEEP', '0')))\n"
        "sys.exit(int(os.environ.get('FAKE_EXEC_CODE', '0')))\n"
    )
    record = tmp_path / "record.json"
    monkeypatch.setenv("FAKE_EXEC_RECORD", str(record))
    host = langhost.LanguageHost(
        langhost.HostArgs(engine_address="127.0.0.1:1", executor=str(executor)), version="9.8.7"
    )
    server, port = langhost.start_server(host)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Host(langhost.language_pb2_grpc.LanguageRuntimeStub(channel), host, venv, record)
    finally:
        channel.close()
        server.stop(0)


def _info(directory: Path, **options: str) -> Any:
    struct = struct_pb2.Struct()
    struct.update(options)
    return pb.ProgramInfo(
        root_directory=str(directory), program_directory=str(directory), entry_point=".", options=struct
    )


def _run_request(program: Path, **options: str) -> Any:
    return pb.RunRequest(
        monitor_address="127.0.0.1:5",
        project="proj",
        stack="dev",
        pwd=str(program),
        dryRun=True,
        parallel=4,
        organization="org",
        config={"proj:greeting": "hi"},
        configSecretKeys=["proj:greeting"],
        args=["extra"],
        info=_info(program, **options),
    )


def test_the_served_rpcs_are_the_overridden_ones() -> None:
    assert set(SERVICE.methods_by_name) >= langhost.SERVED_RPCS
    overridden = {name for name in SERVICE.methods_by_name if name in vars(langhost.LanguageHost)}
    assert overridden == langhost.SERVED_RPCS


def test_every_other_rpc_answers_unimplemented(served: Host) -> None:
    others = [m for m in SERVICE.methods if m.name not in langhost.SERVED_RPCS]
    assert {"Handshake", "GetRequiredPlugins", "InstallDependencies", "GetProgramDependencies"} <= {
        m.name for m in others
    }
    for method in others:
        request = message_factory.GetMessageClass(method.input_type)()
        with pytest.raises(grpc.RpcError) as info:
            call = getattr(served.stub, method.name)
            if method.server_streaming:
                list(call(request, timeout=10))
            else:
                call(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED, method.name


def test_plugin_info_and_required_packages(served: Host, tmp_path: Path) -> None:
    assert served.stub.GetPluginInfo(empty_pb2.Empty(), timeout=10).version == "9.8.7"
    response = served.stub.GetRequiredPackages(pb.GetRequiredPackagesRequest(info=_info(tmp_path)), timeout=10)
    assert list(response.packages) == []


def test_run_starts_the_executor_as_the_go_host_does(served: Host, tmp_path: Path) -> None:
    program = tmp_path / "program"
    program.mkdir()
    response = served.stub.Run(_run_request(program, virtualenv=str(served.fake_venv)), timeout=60)
    assert (response.error, response.bail) == ("", False)
    record = json.loads(served.record.read_text())
    assert record["argv"] == [
        *("--monitor", "127.0.0.1:5", "--engine", "127.0.0.1:1", "--project", "proj"),
        *("--root_directory", str(program), "--stack", "dev", "--pwd", str(program)),
        *("--dry_run", "true", "--parallel", "4", "--organization", "org", ".", "extra"),
    ]
    assert record["cwd"] == str(program)
    assert record["venv"] == str(served.fake_venv)
    assert record["config"] == {"proj:greeting": "hi"}
    assert record["secret_keys"] == ["proj:greeting"]


def test_run_maps_the_program_exit_code(served: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    request = _run_request(tmp_path, virtualenv=str(served.fake_venv))
    monkeypatch.setenv("FAKE_EXEC_CODE", str(langhost.EXIT_CODE_ERROR_ALREADY_SHOWN))
    response = served.stub.Run(request, timeout=60)
    assert (response.error, response.bail) == ("", True)
    monkeypatch.setenv("FAKE_EXEC_CODE", "3")
    response = served.stub.Run(request, timeout=60)
    assert (response.error, response.bail) == ("program exited with non-zero exit code: 3", False)


def test_run_explains_an_unusable_python_environment(served: Host, tmp_path: Path) -> None:
    response = served.stub.Run(_run_request(tmp_path, virtualenv="missing-venv"), timeout=60)
    assert "missing-venv" in response.error and "doesn't exist" in response.error
    assert "./scripts/setup.sh" in response.error
    response = served.stub.Run(_run_request(tmp_path, toolchain="poetry"), timeout=60)
    assert "'poetry' toolchain" in response.error and "not supported" in response.error
    response = served.stub.Run(_run_request(tmp_path, virtualenv=str(served.fake_venv), typechecker="mypy"), timeout=60)
    assert "'mypy' typechecker" in response.error
    assert not served.record.exists()  # no program was started


def test_cancel_stops_a_running_program(served: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_EXEC_SLEEP", "60")
    future = served.stub.Run.future(_run_request(tmp_path, virtualenv=str(served.fake_venv)), timeout=60)
    deadline = time.monotonic() + 30
    while not served.record.exists():
        assert time.monotonic() < deadline, "the program never started"
        time.sleep(0.05)
    served.stub.Cancel(empty_pb2.Empty(), timeout=10)
    assert future.result(timeout=30).error == "program exited unexpectedly: SIGTERM"


def test_about_describes_the_program_python(served: Host, tmp_path: Path) -> None:
    response = served.stub.About(pb.AboutRequest(info=_info(tmp_path, virtualenv=str(served.fake_venv))), timeout=60)
    assert response.version == platform.python_version()
    assert Path(response.executable).exists()
    assert response.metadata["toolchain"] == "pip"


def test_run_plugin_streams_the_output_and_the_exit_code(served: Host, tmp_path: Path) -> None:
    plugin = tmp_path / "policy"
    plugin.mkdir()
    (plugin / "__main__.py").write_text(
        "import os, sys\n"
        "print('to stdout', os.environ['FROM_ENGINE'])\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    request = pb.RunPluginRequest(
        pwd=str(plugin), env=["FROM_ENGINE=yes"], info=_info(plugin, virtualenv=str(served.fake_venv))
    )
    responses = list(served.stub.RunPlugin(request, timeout=60))
    assert b"".join(r.stdout for r in responses) == b"to stdout yes\n"
    assert b"".join(r.stderr for r in responses) == b"to stderr\n"
    assert responses[-1].exitcode == 3


def test_run_plugin_needs_a_main_module(served: Host, tmp_path: Path) -> None:
    request = pb.RunPluginRequest(pwd=str(tmp_path), info=_info(tmp_path, virtualenv=str(served.fake_venv)))
    with pytest.raises(grpc.RpcError) as info:
        list(served.stub.RunPlugin(request, timeout=60))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "__main__.py" in info.value.details()


# ------------------------------------------------------------------------- import cost, launcher


def test_the_host_imports_neither_the_pulumi_sdk_nor_the_rest_of_ale_iac() -> None:
    probe = (
        "import sys, ale_iac.langhost as h\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulumi', 'ale_iac')))\n"
        # The stubs were loaded without registering the SDK: a later import gets the real one.
        "import pulumi, pulumi.runtime.proto.language_pb2 as l\n"
        "print(l.RunResponse is h.language_pb2.RunResponse, pulumi.Output.__name__)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.splitlines()
    assert out == ["['ale_iac', 'ale_iac.langhost']", "True Output"]


def _serve(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], Any]:
    """Start a host as the CLI does and connect to the port it prints first."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/")
    assert proc.stdout is not None
    port = proc.stdout.readline().strip()
    assert port.isdigit(), f"no port on stdout; stderr: {proc.communicate(timeout=10)[1]}"
    stub = langhost.language_pb2_grpc.LanguageRuntimeStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    return proc, stub


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)  # how the CLI stops its plugins
    assert proc.wait(timeout=15) == 0


def test_the_launcher_runs_the_host_from_its_checkout() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc, stub = _serve([sys.executable, str(LAUNCHER), "127.0.0.1:1"], env)
    try:
        # Not installed by build-pulumi.sh: the version is the pinned one.
        assert stub.GetPluginInfo(empty_pb2.Empty(), timeout=10).version == pins().pulumi
    finally:
        _stop(proc)


def test_build_script_installs_the_launcher_beside_the_cli(tmp_path: Path) -> None:
    """build-pulumi.sh on a cached toolchain (a fake CLI) installs a working launcher, once."""
    version = pins().pulumi
    bin_dir = tmp_path / "cache" / "toolchain" / f"pulumi-v{version}" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "pulumi").write_text(f"#!/bin/sh\necho v{version}\n")
    (bin_dir / "pulumi-resource-pulumi-python").write_text("#!/bin/sh\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (bin_dir.parent / "LANGUAGE_HOST_MISSING.txt").write_text("the Go host could not be built\n")
    drop = {"ALE_IAC_PULUMI_VERSION", "ALE_IAC_FORCE_PULUMI_BUILD", "ALE_IAC_LANGUAGE_HOST_PYTHON", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["ALE_IAC_CACHE"] = str(tmp_path / "cache")
    env["PATH"] = "/usr/bin:/bin"  # no other pulumi

    def build(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(REPO / "scripts" / "build-pulumi.sh")],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )

    first = build(ALE_IAC_LANGUAGE_HOST_PYTHON=sys.executable)
    assert first.stdout == f"{bin_dir}\n"
    assert "installed" in first.stderr and "WARNING" not in first.stderr
    host = bin_dir / "pulumi-language-python"
    lines = host.read_text().splitlines()
    assert lines[0] == f"#!{sys.executable}"
    assert f"ALE_IAC_ROOT = {json.dumps(str(REPO))}" in lines
    assert f"HOST_VERSION = {json.dumps(version)}" in lines
    assert "language_host_module=" + str(REPO / "ale_iac" / "langhost.py") in (bin_dir.parent / "BUILDINFO").read_text()

    again = build()  # keeps the interpreter of the installed launcher, and the file
    assert "installed" not in again.stderr
    assert host.read_text().splitlines()[0] == f"#!{sys.executable}"

    proc, stub = _serve([str(host), "127.0.0.1:1"], env)
    try:
        assert stub.GetPluginInfo(empty_pb2.Empty(), timeout=10).version == version
        with pytest.raises(grpc.RpcError) as info:
            stub.GetRequiredPlugins(pb.GetRequiredPluginsRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        _stop(proc)
