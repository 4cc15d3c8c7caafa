"""The scripted server's plan: loading, errors that name the file and the field, which script and turn."""

from __future__ import annotations

from pathlib import Path

import pytest

from ale_iac.errors import ConfigError
from ale_iac.llm.plan import DEFAULT_USAGE, FailTurn, TextTurn, ToolTurn, load_plan

GOOD = """
scripts:
  - match: "(?i)write .* file"
    turns:
      - tool: mcp:vm.write_text
        arguments: {path: /tmp/a, text: hi}
        usage: {input_tokens: 5, output_tokens: 2}
      - tool: shell
        arguments: {command: cat /tmp/a}
      - fail: drop
      - text: Done.
  - match: "."
    turns:
      - text: fallback
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_a_plan_loads_with_each_kind_of_turn(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, GOOD))
    first = plan.scripts[0].turns
    assert [type(t) for t in first] == [ToolTurn, ToolTurn, FailTurn, TextTurn]
    tool = first[0]
    assert isinstance(tool, ToolTurn) and tool.mcp_parts() == ("vm", "write_text")
    assert tool.usage.input_tokens == 5
    assert isinstance(first[1], ToolTurn) and first[1].usage == DEFAULT_USAGE


def test_the_first_matching_script_wins(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, GOOD))
    assert plan.script_for("Please WRITE hello to the FILE") == 0
    assert plan.script_for("anything else") == 1
    assert plan.script_for("") is None


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("scripts: []\n", "scripts", "at least 1"),
        ("scripts:\n  - match: '('\n    turns: [{text: a}]\n", "scripts.0.match", "not a valid regular expression"),
        ("scripts:\n  - match: a\n    turns: []\n", "scripts.0.turns", "at least 1"),
        ("scripts:\n  - match: a\n    turns: [{text: a}, {tool: vm.run}]\n", "scripts.0.turns.1.tool", "is not a tool"),
        (
            "scripts:\n  - match: a\n    turns: [{tool: shell, arguments: {cmd: ls}}]\n",
            "scripts.0.turns.0",
            "arguments.command",
        ),
        ("scripts:\n  - match: a\n    turns: [{text: a, tool: shell}]\n", "scripts.0.turns.0", "exactly one of"),
        ("scripts:\n  - match: a\n    turns: [{say: a}]\n", "scripts.0.turns.0", "exactly one of"),
        ("scripts:\n  - match: a\n    turns: [{fail: timeout}]\n", "scripts.0.turns.0.fail", "http_500"),
        (
            "scripts:\n  - match: a\n    turns: [{fail: drop, usage: {input_tokens: 1, output_tokens: 1}}]\n",
            "scripts.0.turns.0.usage",
            "unknown key",
        ),
        (
            "scripts:\n  - match: a\n    turns: [{text: a, usage: {input_tokens: -1, output_tokens: 0}}]\n",
            "scripts.0.turns.0.usage.input_tokens",
            "greater than or equal",
        ),
        ("scripts:\n  - match: a\n    turns: [{text: a}]\n    model: x\n", "scripts.0.model", "unknown key"),
    ],
)
def test_errors_name_the_file_and_the_field(tmp_path: Path, text: str, field: str, says: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_plan(path)
    assert caught.value.source == str(path)
    assert caught.value.field == field
    assert says in caught.value.detail


def test_a_missing_file_and_bad_yaml_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_plan(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML at line 2"):
        load_plan(write(tmp_path, "scripts: [\n"))


def test_the_plans_in_the_docs_load() -> None:
    import json
    import re

    import yaml

    from ale_iac.llm import plan as plan_module
    from ale_iac.llm.gateway import ModelGateway
    from ale_iac.llm.plan import plan_from
    from tests.support.cli import REPO

    page = (REPO / "docs" / "models.md").read_text()
    (documented,) = re.findall(r"^```yaml\n(.*?)^```$", page, flags=re.M | re.S)
    assert len(plan_from(yaml.safe_load(documented), "docs/models.md").scripts) == 2
    (docstring,) = re.findall(r"```yaml\n(.*?)```", plan_module.__doc__ or "", flags=re.S)
    assert len(plan_from(yaml.safe_load(docstring), "plan.py").scripts) == 2
    # The usage record shown has the keys usage() returns.
    (record,) = re.findall(r"^```json\n(.*?)^```$", page, flags=re.M | re.S)
    shown = json.loads(record)
    gateway = ModelGateway()
    gateway.grant("u", api="anthropic", upstream_base_url=None, api_key=None)
    actual = gateway.usage("u")
    assert shown.keys() == actual.keys() and shown["latency"].keys() == actual["latency"].keys()
    assert shown["latency"]["ttfb"].keys() == actual["latency"]["ttfb"].keys()
    gateway.close()
