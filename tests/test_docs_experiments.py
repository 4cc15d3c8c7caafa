"""docs/experiments.md: every code block on the page works exactly as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ale_iac.agent_sdk import AgentConfig, load_deployer_class
from ale_iac.errors import ConfigError
from ale_iac.runner.evaluation import bridge_tools, check_agents
from ale_iac.runner.experiment import ExperimentSpec, load_experiment
from tests.support.sandbox import Endpoint

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "experiments.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE.read_text(), flags=re.M | re.S)


def test_the_page_has_the_blocks_this_test_checks() -> None:
    assert (len(blocks("yaml")), len(blocks("python"))) == (4, 2)


def test_the_experiment_file_loads_and_its_defaults_match_the_table(tmp_path: Path) -> None:
    experiment_yaml = blocks("yaml")[0]
    (tmp_path / "tasks").symlink_to(REPO / "examples" / "tasks")
    path = tmp_path / "experiment.yaml"
    path.write_text(experiment_yaml)
    experiment = load_experiment(path)
    assert experiment.spec.retain_below == 0.5 and [t.id for t in experiment.tasks] == ["cli-log-stats"]
    assert experiment.output_root == tmp_path / "runs"
    check_agents(experiment)
    defaults = ExperimentSpec(name="x", agents=["a"], tasks=["t"])
    table = PAGE.read_text()
    for field, shown in (("repeats", "1"), ("concurrency", "1"), ("unit_timeout_s", "900"), ("output_root", "`runs`")):
        assert str(getattr(defaults, field)) == shown.strip("`")
        assert f"| `{field}` | {shown} |" in table


def test_the_static_route_of_forwarders_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    from ale_iac.profile import StaticRoute, parse_profile

    snapshots = yaml.safe_load(blocks("yaml")[1])
    route = parse_profile({"name": "x", "snapshots": snapshots}, "docs").profile.snapshots["gce-vm"]
    assert isinstance(route, StaticRoute) and route.egress is not None
    monkeypatch.setenv("ALE_GCE_TOKEN", "t0ken")
    assert route.gateway_channel() is not None and route.endpoint_token() == "t0ken"


def test_the_preset_and_deployer_examples_work(tmp_path: Path) -> None:
    _, _, preset_yaml, _ = blocks("yaml")
    deployer_py = blocks("python")[0]
    (tmp_path / "preset.yaml").write_text(preset_yaml)
    (tmp_path / "deployer.py").write_text(deployer_py)
    data = yaml.safe_load(preset_yaml)
    config = AgentConfig.model_validate({**data, "source_dir": str(tmp_path)})
    cls = load_deployer_class(config)
    cls.validate_config(config, bridge_tools())
    hot = config.model_copy(update={"settings": {"temperature": 3}})
    with pytest.raises(ConfigError, match="temperature"):
        cls.validate_config(hot, bridge_tools())


def test_the_scripted_plan_example_passes_the_checks_and_fills_the_task_folders() -> None:
    data = yaml.safe_load(blocks("yaml")[3])
    config = AgentConfig.model_validate({**data, "source_dir": str(REPO / "agents" / "scripted")})
    cls = load_deployer_class(config)
    cls.validate_config(config, bridge_tools())
    module = sys.modules[cls.__module__]
    [plan] = data["settings"]["plans"]
    match = re.search(plan["match"], "Write the answer in answer.txt.")
    assert match is not None
    variables = {"input_dir": "/t/x/input", "output_dir": "/t/x/output", "answer": "42", **match.groupdict()}
    assert module.fill(plan["steps"][1]["args"], variables) == {"path": "/t/x/output/answer.txt", "content": "42\n"}
    broken = {**data, "settings": {**data["settings"], "plans": [{**plan, "steps": [{"bridge": "vm", "tool": "ls"}]}]}}
    with pytest.raises(ConfigError, match="has no tool 'ls'"):
        cls.validate_config(AgentConfig.model_validate({**broken, "source_dir": config.source_dir}), bridge_tools())


@pytest.mark.sandbox
def test_the_mcp_client_example_runs_against_a_sandbox(computer_server_endpoint: Endpoint, tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(blocks("python")[1])
    # As a user runs it: the venv's python by its path, the venv not on PATH (nor activated).
    bare_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {**os.environ, "ALE_IAC_ENDPOINT": computer_server_endpoint.url, "PATH": bare_path}
    env.pop("VIRTUAL_ENV", None)
    if computer_server_endpoint.token:
        env["ALE_IAC_ENDPOINT_TOKEN"] = computer_server_endpoint.token
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    tools, result = out.stdout.split("\n", 1)
    assert "'run_command'" in tools and "'write_text'" in tools
    assert "Linux" in result
