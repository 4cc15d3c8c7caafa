"""`ale-iac sandbox create|ls|destroy`, `doctor` and bad input, through the real command line."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
from pathlib import Path

import pytest
from rich.console import Console

from ale_iac.cli.sandbox import ls_table
from ale_iac.engine import Engine
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.sandbox.protocol import ComputerServerError
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.cli import ale_iac


@pytest.mark.sandbox
@pytest.mark.engine
def test_create_use_list_and_destroy_a_sandbox() -> None:
    created = ale_iac("sandbox", "create", "--profile", "local", "--json")
    assert created.returncode == 0, created.stderr
    handle = json.loads(created.stdout)
    assert handle["provider"] == "local" and handle["endpoint"].startswith("http://127.0.0.1:")

    assert handle["endpoint_token"] == "**********"  # printed handles never show the token
    exported = ale_iac("sandbox", "env", handle["stack"])
    assert exported.returncode == 0, exported.stderr
    variables = dict(re.findall(r"^export (\w+)=(\S+)$", exported.stdout, re.MULTILINE))
    assert variables["ALE_IAC_ENDPOINT"] == handle["endpoint"]
    token = variables["ALE_IAC_ENDPOINT_TOKEN"]

    async def use(token: str | None) -> str:
        async with ComputerServerClient(handle["endpoint"], token=token) as client:
            return (await client.run_command("echo hi from $(hostname)")).stdout

    try:
        said = asyncio.run(use(token))
    except Exception as exc:
        tails = "\n".join(local_sandboxes.log_tails(state) for state in local_sandboxes.list_sandboxes())
        raise AssertionError(f"the sandbox stopped answering: {exc}\n{tails}") from exc
    assert said.startswith("hi from ")
    with pytest.raises(ComputerServerError, match="HTTP 401"):
        asyncio.run(use(None))
    listed = json.loads(ale_iac("sandbox", "ls", "--json").stdout)
    assert [(r["stack"], r["endpoint"], r["run"]) for r in listed] == [(handle["stack"], handle["endpoint"], "-")]

    destroyed = ale_iac("sandbox", "destroy", handle["stack"])
    assert destroyed.returncode == 0 and f"destroyed {handle['stack']}" in destroyed.stdout
    assert json.loads(ale_iac("sandbox", "ls", "--json").stdout) == []
    assert local_sandboxes.list_sandboxes() == []


@pytest.mark.engine
def test_a_malformed_profile_gives_one_clear_error_and_creates_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text("config:\n  ale-iac:profile:\n    name: bad\n    snapshots:\n      s: {provider: local, vcpu: 2}\n")
    result = ale_iac("sandbox", "create", "--profile", str(bad))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {bad}: ale-iac:profile.snapshots.s.vcpu: unknown key"
    assert Engine().list_stacks() == [] and local_sandboxes.list_sandboxes() == []


@pytest.mark.engine
def test_a_bad_experiment_gives_one_clear_error_and_creates_nothing(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: x\nagents: [scripted]\ntasks: [../nowhere]\nprofile: local\n")
    result = ale_iac("evaluate", str(exp))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {exp}: tasks: '../nowhere' is neither a task folder nor a list file"
    assert Engine().list_stacks() == [] and not (tmp_path / "runs").exists()


@pytest.mark.sandbox
@pytest.mark.engine
def test_doctor_reports_the_toolchain_and_says_local_can_run() -> None:
    result = ale_iac("doctor", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"bin/pulumi \(v3\.\d+\.\d+\)", result.stdout)
    assert "the `local` profile can run here" in result.stdout


def test_doctor_fails_with_the_reason_when_there_is_no_pulumi(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ALE_IAC_PULUMI": str(tmp_path / "none"),
        "ALE_IAC_CACHE": str(tmp_path),
        "PATH": "/usr/bin:/bin",
    }
    result = ale_iac("doctor", env=env, timeout=120)
    assert result.returncode == 1
    assert "Pulumi CLI not found" in result.stdout and "cannot run here" in result.stdout


LONG_STACK = "run-an-experiment-with-a-long-name-20261201-040226-16498-scripted--gui-notepad--r0-7f3a"
LS_ROWS = [
    {
        "stack": LONG_STACK,
        "unit": "scripted__gui-notepad__r0",
        "run": "an-experiment-with-a-long-name-20261201-040226-16498",
        "endpoint": "http://127.0.0.1:38411",
        "provider": "local",
        "locked": False,
    },
    {"stack": "sbx-local-8f3a2b1c", "unit": "unit", "run": "-", "endpoint": "http://127.0.0.1:1", "provider": "docker",
     "locked": True},
]  # fmt: skip


@pytest.mark.parametrize("width", [80, 120, 200])
def test_sandbox_ls_keeps_every_column_readable_on_a_narrow_terminal(width: int) -> None:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(ls_table(LS_ROWS, width))
    lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert max(len(line) for line in lines) <= width
    header = [cell.strip() for cell in lines[1].strip("┃").split("┃")]
    assert header == ["unit", "provider", "endpoint", "run", "locked", "stack"]
    body = [[cell.strip() for cell in line.strip("│").split("│")] for line in lines[3:-1]]
    assert "".join(cells[5] for cells in body) == LONG_STACK + "sbx-local-8f3a2b1c"  # whole, folded at most
    assert [cells[1] for cells in body if cells[1]] == ["local", "docker"]
    assert "".join(cells[2] for cells in body) == "http://127.0.0.1:38411http://127.0.0.1:1"
