"""`ale-iac evaluate examples/demo.yaml` on the `local` profile as a normal user (rootless sandboxes).

The user is made by the session (tests/support/rootless.py); the real Pulumi engine, real sandboxes and
the demo's three tasks (a CLI one, a GUI one with an xterm, a mixed one) must all score 1.0, and
nothing may be left for ``gc``.
"""

from __future__ import annotations

import json
import sys

import pytest

from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.rootless import HostUser

pytestmark = [
    pytest.mark.rootless,
    pytest.mark.engine,
    pytest.mark.xdist_group("evaluate-rootless"),
    pytest.mark.timeout(480),
]


def test_the_demo_scores_one_as_a_normal_user(rootless_user: HostUser) -> None:
    out_dir = rootless_user.home / "runs"
    done = rootless_user.run(
        [sys.executable, "-m", "ale_iac", "evaluate", "examples/demo.yaml", "--out", str(out_dir)], timeout=420
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (run_dir,) = list(out_dir.iterdir())
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(results) == 3 and {r["score"] for r in results} == {1.0}, results
    assert local_sandboxes.list_sandboxes(home=rootless_user.ale_home) == []
    assert rootless_user.processes() == []
    gc = rootless_user.run([sys.executable, "-m", "ale_iac", "gc", "--dry-run"], timeout=120)
    assert gc.returncode == 0 and "nothing to collect" in gc.stdout, gc.stdout + gc.stderr
