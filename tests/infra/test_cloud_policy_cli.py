"""The policy pack under the real Pulumi CLI: ``pulumi preview --policy-pack policy`` loads and runs it.

No cloud provider plugin can be had here, so the previewed program is a minimal Python project of
its own (no cloud resource); what this shows is the packaging: PulumiPolicy.yaml, its virtualenv
and ``policy/__main__.py`` as the CLI starts them. The policies themselves are tested offline in
test_cloud_policy.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ale_iac.toolchain import find_toolchain

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]


def test_pulumi_preview_runs_the_policy_pack_with_the_real_cli(tmp_path: Path) -> None:
    toolchain = find_toolchain()
    project = tmp_path / "project"
    project.mkdir()
    (project / "Pulumi.yaml").write_text(
        "name: policy-probe\nruntime:\n  name: python\n  options:\n    virtualenv: .venv\n"
    )
    (project / "__main__.py").write_text("import pulumi\n\npulumi.export('probe', 'ok')\n")
    shutil.copytree(REPO / "policy", project / "policy", ignore=shutil.ignore_patterns("__pycache__"))
    (project / ".venv").symlink_to(REPO / ".venv")
    env = {
        **os.environ,
        "PATH": f"{toolchain.bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PULUMI_BACKEND_URL": f"file://{tmp_path / 'state'}",
        "PULUMI_CONFIG_PASSPHRASE": "test-only",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_HOME": str(tmp_path / "pulumi-home"),
        "PYTHONPATH": str(REPO),
    }
    (tmp_path / "state").mkdir()
    pulumi = str(toolchain.bin_dir / "pulumi")
    subprocess.run([pulumi, "stack", "init", "probe", "--non-interactive"], cwd=project, env=env, check=True)
    result = subprocess.run(
        [pulumi, "preview", "--diff", "--policy-pack", "policy", "--stack", "probe", "--non-interactive"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Policy Packs run:" in result.stdout
    assert "ale-iac-guardrails" in result.stdout
    assert "mandatory" not in result.stdout.lower()  # nothing to violate in a program without resources
