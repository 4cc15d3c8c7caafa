"""`ale-iac evaluate` with an egress policy, end to end: real engine, local units, the fake internet of
``tests/support/fake_internet.py``. A task's setup reaches an allowed host through the unit's proxy with no
proxy flag of its own (the runner's commands in the unit see ``HTTP_PROXY``; a unit without a policy sees none);
one that needs a refused host fails its setup with an error naming what was refused; every attempt is in the
record. A pool run's leased unit gets its route's policy (narrowed by its card) as an ephemeral unit does."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from ale_iac.egress_policy import EgressPolicy
from ale_iac.engine import Engine
from ale_iac.infra.program import inline_program, pool_units
from ale_iac.paths import ale_home
from ale_iac.profile import PoolSpec, parse_profile
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

FETCH = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=20) as reply:  # HTTP_PROXY from the unit's environment
    print(reply.read().decode())
"""

TASK_MAIN = """
import base64
SCRIPT = base64.b64encode(FETCH.encode()).decode()

async def setup(sandbox):
    if EXPECTED is not None:  # the proxy variables the unit's commands see
        seen = await sandbox.run("env | grep -i _proxy=")
        if sorted(seen.stdout.split()) != EXPECTED:
            raise RuntimeError(f"the unit's proxy variables: {seen.stdout!r}")
    if URL is None:
        return
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
MARKS = ("leased", "phase_start", "egress")
PROXY_VARS = [f"{name}={IN_UNIT_PROXY}" for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")] + [
    "NO_PROXY=127.0.0.1,localhost",
    "no_proxy=127.0.0.1,localhost",
]


def _task(root: Path, task_id: str, url: str | None, card: str = "", expected: list[str] | None = None) -> None:
    """A task whose setup fetches ``url`` in the unit (with no proxy flag), after checking that the unit's
    commands see exactly ``expected`` of the proxy variables (when given)."""
    folder = root / task_id
    (folder / "input").mkdir(parents=True)
    (folder / "reference").mkdir()
    (folder / "task.yaml").write_text(f"id: {task_id}\ninstruction: Answer 6*7 in output/answer.txt.\n{card}")
    wanted = None if expected is None else sorted(expected)
    (folder / "main.py").write_text(f"FETCH = {FETCH!r}\nURL = {url!r}\nEXPECTED = {wanted!r}\n{TASK_MAIN}")


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeInternet]:
    with fake_internet(["allowed.test", "other.test"], tmp_path_factory.mktemp("fake-internet")) as net:
        yield net


def test_a_run_records_every_attempt_and_a_refused_setup_names_what_was_refused(
    tmp_path: Path, internet: FakeInternet
) -> None:
    _task(tmp_path, "fetch-ok", "http://allowed.test/", expected=PROXY_VARS)
    _task(tmp_path, "fetch-refused", "http://other.test/")
    _task(tmp_path, "closed", None, card="snapshot: closed\n", expected=[])  # no policy: no proxy variables
    make_preset(tmp_path, "writer", "WriterAgent")
    profile = tmp_path / "Pulumi.egress.yaml"
    profile.write_text(
        "config:\n  ale-iac:profile:\n    name: egress\n    default_snapshot: s\n    snapshots:\n"
        f"      s: {{provider: local, egress: {{allow: [allowed.test], resolver: {internet.dns}}}}}\n"
        "      closed: {provider: local}\n"
    )
    tasks = ["fetch-ok", "fetch-refused", "closed"]
    spec = {"name": "t", "agents": ["writer.yaml"], "tasks": tasks, "profile": str(profile)}
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))
    summary = run_experiment(load_experiment(tmp_path / "exp.yaml", {}))
    by_task = {o.task: o for o in summary.outcomes}
    assert by_task["fetch-ok"].status is UnitStatus.SUCCEEDED, by_task["fetch-ok"]
    assert by_task["closed"].status is UnitStatus.SUCCEEDED, by_task["closed"]
    assert "egress" not in json.loads((summary.run_dir / by_task["closed"].unit_id / "run.json").read_text())
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


def test_a_pool_lease_gets_its_routes_policy_narrowed_by_its_card(tmp_path: Path, internet: FakeInternet) -> None:
    """A pool stack of one local unit whose route allows both names: a task that names no egress of its own
    reaches other.test; one whose card narrows the policy to allowed.test is refused it. Each lease's egress
    opens once the leased unit is ready and closes before its reset, on that unit's record."""
    stack = f"egress-pool-{secrets.token_hex(3)}"
    policy = {"allow": ["allowed.test", "other.test"], "resolver": internet.dns}
    profile = parse_profile(
        {"name": stack, "snapshots": {"s": {"provider": "local", "egress": policy}}}, "Pulumi.pool.yaml"
    ).profile
    _task(tmp_path, "wide", "http://other.test/", expected=PROXY_VARS)
    _task(tmp_path, "narrow", "http://other.test/", card="egress: {allow: [allowed.test]}\n")
    make_preset(tmp_path, "writer", "WriterAgent")
    spec = {"name": "p", "agents": ["writer.yaml"], "tasks": ["wide", "narrow"], "pool": stack}
    (tmp_path / "exp.yaml").write_text(json.dumps(spec))
    engine = Engine()
    engine.up(stack, inline_program(profile, pool_units(PoolSpec(units=1), stack), stack))
    try:
        assert engine.units(stack)["u0"].egress == EgressPolicy.model_validate(policy).model_dump(mode="json")
        summary = run_experiment(load_experiment(tmp_path / "exp.yaml", {}))
    finally:
        engine.destroy(stack)
    by_task = {o.task: o for o in summary.outcomes}
    assert by_task["wide"].status is UnitStatus.SUCCEEDED, by_task["wide"]
    narrow = by_task["narrow"]
    assert narrow.status is UnitStatus.SETUP_FAILED, narrow
    assert "the egress policy refused other.test:80 (no allow entry matches the name)" in (narrow.error or "")
    for outcome, summary_line, allowed in (
        (by_task["wide"], "proxy: allow allowed.test, other.test; ports 80, 443", True),
        (narrow, "proxy: allow allowed.test; ports 80, 443", False),
    ):
        folder = summary.run_dir / outcome.unit_id
        run = json.loads((folder / "run.json").read_text())
        assert run["egress"]["policy"] == summary_line, run["egress"]
        lines = [json.loads(line) for line in (folder / "egress.jsonl").read_text().splitlines()]
        assert [(x["host"], x["allowed"]) for x in lines] == [("other.test", allowed)]
        events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        # The lease, then its egress opened once ready (phase), closed (its record) before the cleanup's reset.
        marks = [e["phase"] if e["event"] == "phase_start" else e["event"] for e in events if e["event"] in MARKS]
        first = marks.index("leased")
        assert marks[first : first + 4] == ["leased", "ready", "egress", "setup"], marks
        assert marks[-2:] == ["egress", "cleanup"], marks
    assert not list((ale_home() / "egress").glob("*")), "an egress proxy was left behind"
