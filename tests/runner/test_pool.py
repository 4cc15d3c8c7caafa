"""A pool stack brought up with plain `pulumi up` serves concurrent evaluations, one unit each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ale_iac.engine import Engine
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.pools import plain_pulumi, pool_project
from tests.support.tasks import make_preset, make_task

# A pool stack via `pulumi up`, two evaluations on it, then `pulumi destroy`: 32 s on a loaded 2-core host,
# with deadlines of its own of 300 s and more.
pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.engine,
    pytest.mark.xdist_group("pool-plain-pulumi"),
    pytest.mark.timeout(480),
]

REPO = Path(__file__).resolve().parents[2]


def test_pool_stack_from_pulumi_up_is_leased_exclusively(tmp_path: Path) -> None:
    engine = Engine()
    stack_file = (REPO / "stacks" / "Pulumi.local.yaml").read_text()
    project = pool_project(engine, tmp_path / "project", "local", stack_file)

    plain_pulumi(engine, project, "stack", "init", "local")
    try:
        plain_pulumi(engine, project, "up", "--yes", "-s", "local")
        units = engine.units("local")
        assert sorted(units) == ["u0", "u1"] and len(local_sandboxes.list_sandboxes()) == 2

        lab = tmp_path / "lab"
        lab.mkdir()
        make_task(lab, "answer")
        make_preset(lab, "writer", "WriterAgent", "settings: {linger_s: 6}\n")
        runs = []
        for i in range(2):
            exp = lab / f"exp{i}.yaml"
            exp.write_text(json.dumps({"name": f"p{i}", "agents": ["writer.yaml"], "tasks": ["answer"]}))
            runs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "ale_iac", "evaluate", str(exp), "--pool", "local"],
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs = [p.communicate(timeout=300)[0] for p in runs]
        assert [p.returncode for p in runs] == [0, 0], outputs

        leased = []
        windows = []
        for events in lab.glob("runs/*/*/events.jsonl"):
            rows = [json.loads(line) for line in events.read_text().splitlines()]
            leased += [r["unit"] for r in rows if r["event"] == "leased"]
            agent = [r for r in rows if r.get("phase") == "agent"]
            windows.append((agent[0]["t"], agent[-1]["t"]))
        assert sorted(leased) == ["u0", "u1"], "two concurrent runs shared a unit"
        (_, first_end), (second_start, _) = sorted(windows)
        assert second_start < first_end, "the two evaluations did not overlap, so the test proves nothing"
        # The pool is untouched by the runs' cleanup.
        assert sorted(engine.units("local")) == ["u0", "u1"] and len(local_sandboxes.list_sandboxes()) == 2
    finally:
        plain_pulumi(engine, project, "destroy", "--yes", "-s", "local")
        plain_pulumi(engine, project, "stack", "rm", "--yes", "-s", "local")
    assert local_sandboxes.list_sandboxes() == []
