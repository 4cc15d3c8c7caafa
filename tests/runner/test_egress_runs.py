"""`ale-iac evaluate` with an egress policy, end to end: real engine, local units, the fake internet of
``tests/support/fake_internet.py``. A task's setup reaches an allowed host through the unit's proxy; one that
needs a refused host fails its setup with an error naming what was refused; every attempt is in the record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale_iac.paths import ale_home
from ale_iac.runner.evaluation import run_experiment
from ale_iac.runner.experiment import load_experiment
from ale_iac.runner.status import UnitStatus
from ale_iac.substrates.egress import IN_UNIT_PROXY
from tests.support.fake_internet import FakeInternet, fake_internet
from tests.support.tasks import make_preset

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.engine,
    pytest.mark.xdist_group("evaluate-runs"),
    pytest.mark.timeout(480),
]

FETCH = f"""
import sys, urllib.request
proxy = urllib.request.ProxyHandler({{"http": {IN_UNIT_PROXY!r}}})
with urllib.request.build_opener(proxy).open(sys.argv[1], timeout=20) as reply:
    print(reply.read().decode())
"""

TASK_MAIN = """
import base64
SCRIPT = base64.b64encode(FETCH.encode()).decode()

async def setup(sandbox):
    command = f"python3 -c \\"import base64,sys; exec(base64.b64decode('{SCRIPT}'))\\" {URL}"
    result = await sandbox.run(command)
    if result.exit_code != 0:
        raise RuntimeError("the task's download failed")
    if "hello from" not in result.stdout:
        raise RuntimeError(f"unexpected page: {result.stdout!r}")


async def evaluate(sandbox):
    result = await sandbox.run(f"cat {sandbox.output_dir}/answer.txt")
    return 1.0 if result.stdout.split()[:1] == ["42"] else 0.0
"""


def _task(root: Path, task_id: str, url: str) -> None:
    folder = root / task_id
    (folder / "input").mkdir(parents=True)
    (folder / "reference").mkdir()
    (folder / "task.yaml").write_text(f"id: {task_id}\ninstruction: Answer 6*7 in output/answer.txt.\n")
    (folder / "main.py").write_text(f"FETCH = {FETCH!r}\nURL = {url!r}\n{TASK_MAIN}")


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeInternet]:
    with fake_internet(["allowed.test", "other.test"], tmp_path_factory.mktemp("fake-internet")) as net:
        yield net


def test_a_run_records_every_attempt_and_a_refused_setup_names_what_was_refused(
    tmp_path: Path, internet: FakeInternet
) -> None:
    _task(tmp_path, "fetch-ok", "http://allowed.test/")
    _task(tmp_path, "fetch-refused", "http://other.test/")
    make_preset(tmp_path, "writer", "WriterAgent")
    profile = tmp_path / "Pulumi.egress.yaml"
    profile.write_text(
        "config:\n  ale-iac:profile:\n    name: egress\n    snapshots:\n      s:\n        provider: local\n"
        f"        egress: {{allow: [allowed.test], resolver: {internet.dns}}}\n"
    )
    spec = {"name": "t", "agents": ["writer.yaml"], "tasks": ["fetch-ok", "fetch-refused"], "profile": str(profile)}
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))
    summary = run_experiment(load_experiment(tmp_path / "exp.yaml", {}))
    by_task = {o.task: o for o in summary.outcomes}
    assert by_task["fetch-ok"].status is UnitStatus.SUCCEEDED, by_task["fetch-ok"]
    refused = by_task["fetch-refused"]
    assert refused.status is UnitStatus.SETUP_FAILED
    assert "the egress policy refused other.test:80 (no allow entry matches the name)" in (refused.error or "")
    for outcome, allowed, denied in ((by_task["fetch-ok"], 1, 0), (refused, 0, 1)):
        folder = summary.run_dir / outcome.unit_id
        run = json.loads((folder / "run.json").read_text())
        assert run["egress"]["allowed"] == allowed and run["egress"]["refused"] == denied, run["egress"]
        assert run["egress"]["policy"] == "proxy: allow allowed.test; ports 80, 443"
        assert run["egress"]["channel_bytes_out"] >= run["egress"]["bytes_out"] > 0
        lines = [json.loads(line) for line in (folder / "egress.jsonl").read_text().splitlines()]
        assert [(x["host"], x["allowed"]) for x in lines] == [
            ("allowed.test" if allowed else "other.test", bool(allowed))
        ]
    assert not list((ale_home() / "egress").glob("*")), "an egress proxy was left behind"
