"""docs/models.md, *A dry run*: the ``evaluate --model-plan`` example names files that load and pass the
checks; ``tests/agents/test_cli_agents.py`` runs it as printed, with the real CLIs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ale_iac.runner.evaluation import check_agents
from ale_iac.runner.experiment import load_experiment

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "models.md"


def dry_run_command() -> list[str]:
    """The one command of the page that runs ``evaluate --model-plan``, as argv."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", PAGE.read_text(), flags=re.M | re.S)
    [command] = [b.strip() for b in blocks if "--model-plan" in b]
    argv = shlex.split(command)
    assert argv[:2] == [".venv/bin/ale-iac", "evaluate"], argv
    return argv[1:]


def test_the_dry_run_example_names_an_experiment_and_a_plan_that_load() -> None:
    argv = dry_run_command()
    experiment = load_experiment(REPO / argv[1], {"model_plan": str(REPO / argv[argv.index("--model-plan") + 1])})
    assert experiment.model_plan is not None and [a.name for a in experiment.agents] == ["claude-code", "codex"]
    check_agents(experiment)
