"""Small tasks in ALE's format (cua-bench tasks), written for these tests, and a scripted agent for them.

``make_ale_lab(root)`` writes::

    root/ale/tasks/ale_test_config.py      shared helper, imported as tasks.ale_test_config (namespace package)
    root/ale/tasks/demo/secret_token/      no task data: setup stages a token made by load(); [score]
    root/ale/tasks/demo/upper_word/        no task data; scripts/score_outputs.py (KIND "upper"); a bare number
    root/ale/tasks/data/sum_numbers/       task data + hidden reference; scripts/score_outputs.py (KIND "sum"); a dict
    root/ale/tasks/gui/type_line/          GUI: setup starts an xterm that saves one typed line; [score]
    root/ale/tasks/demo/crash_eval/        evaluate raises
    root/ale/tasks/data/no_data/           requires task data the store does not have
    root/ale/selected.txt                  a task list of <domain>/<task> lines
    root/ale-data/data/sum_numbers/v1/{input,software,reference}
    root/ale-agent.yaml                    the scripted agent's plans for them
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFIG = """
import os

ROOT = os.environ.get("REMOTE_ROOT_DIR", "/media/user/data/agenthle")


def task_metadata(domain, task, requires_task_data=True, variant="v1"):
    task_dir = f"{ROOT}/{domain}/{task}/{variant}"
    return {
        "domain_name": domain,
        "task_name": task,
        "variant_name": variant,
        "requires_task_data": requires_task_data,
        "task_dir": task_dir,
        "input_dir": f"{task_dir}/input",
        "software_dir": f"{task_dir}/software",
        "remote_output_dir": f"{task_dir}/output",
        "reference_dir": f"{task_dir}/reference",
    }


LINUX = {"provider": "computer", "setup_config": {"os_type": "linux"}}
"""

SECRET_TOKEN = """
import secrets
from dataclasses import dataclass, field

import cua_bench as cb

from tasks.ale_test_config import LINUX, task_metadata


@dataclass
class SecretConfig:
    token: str = field(default_factory=lambda: secrets.token_hex(8))  # a fresh one at every load()


@cb.tasks_config(split="train")
def load():
    metadata = {**task_metadata("demo", "secret_token", requires_task_data=False), "token": SecretConfig().token}
    return [cb.Task(description="ALE-SECRET: copy the token in secret.txt of the input folder into "
                    "answer.txt of the output folder.", metadata=metadata, computer=LINUX)]


@cb.setup_task(split="train")
async def start(task_cfg: cb.Task, session: cb.DesktopSession) -> None:
    md = task_cfg.metadata
    await session.interface.create_dir(md["input_dir"])
    await session.write_file(md["input_dir"] + "/secret.txt", md["token"] + "\\n")
    if await session.directory_exists(md["reference_dir"]):
        raise RuntimeError("a reference folder is visible before the agent runs")


@cb.evaluate_task(split="train")
async def evaluate(task_cfg: cb.Task, session: cb.DesktopSession) -> list[float]:
    path = task_cfg.metadata["remote_output_dir"] + "/answer.txt"
    if not await session.file_exists(path):
        return [0.0]
    listed = "answer.txt" in await session.list_dir(task_cfg.metadata["remote_output_dir"])
    shown = await session.run_command(f"cat {path}")
    same = (await session.read_file(path)).strip() == task_cfg.metadata["token"] == shown["stdout"].strip()
    return [1.0 if same and listed and shown["return_code"] == 0 else 0.0]
"""

SCORE_SUM = '''
KIND = "sum"


def score(expected, got):
    """1 if the totals are equal."""
    return 1.0 if expected.strip() == got.strip() else 0.0
'''

SCORE_UPPER = '''
KIND = "upper"


def score(expected, got):
    """1 if ``got`` is ``expected`` in capitals (a different grader under the same module name)."""
    return 1.0 if got.strip() == expected.strip().upper() else 0.0
'''

SUM_NUMBERS = """
import cua_bench as cb
import score_outputs

from tasks.ale_test_config import LINUX, task_metadata

assert score_outputs.KIND == "sum", f"another task's score_outputs: {score_outputs.KIND}"


@cb.tasks_config(split="train")
def load():
    return [cb.Task(description="ALE-SUM: add up the numbers in numbers.txt of the input folder; write the "
                    "total into sum.txt of the output folder.", metadata=task_metadata("data", "sum_numbers"),
                    computer=LINUX)]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    md = task_cfg.metadata
    if not await session.file_exists(md["input_dir"] + "/numbers.txt"):
        raise RuntimeError("input was not staged")
    if (await session.read_bytes(md["software_dir"] + "/tool.txt")) != b"a tool\\n":
        raise RuntimeError("software was not staged")
    if await session.directory_exists(md["reference_dir"]):
        raise RuntimeError("the reference is visible before the agent runs")


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session):
    md = task_cfg.metadata
    expected = await session.read_file(md["reference_dir"] + "/expected.txt")
    path = md["remote_output_dir"] + "/sum.txt"
    got = await session.read_file(path) if await session.file_exists(path) else ""
    return {"score": score_outputs.score(expected, got), "got": got.strip()}
"""

UPPER_WORD = """
import cua_bench as cb
from score_outputs import KIND, score

from tasks.ale_test_config import LINUX, task_metadata

assert KIND == "upper", f"another task's score_outputs: {KIND}"
WORD = "agents"


@cb.tasks_config(split="train")
def load():
    metadata = task_metadata("demo", "upper_word", requires_task_data=False)
    return [cb.Task(description="ALE-UPPER: write the word in word.txt of the input folder in capitals into "
                    "upper.txt of the output folder.", metadata=metadata, computer=LINUX)]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    await session.interface.create_dir(task_cfg.metadata["input_dir"])
    await session.write_text(task_cfg.metadata["input_dir"] + "/word.txt", WORD + "\\n")


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session):
    path = task_cfg.metadata["remote_output_dir"] + "/upper.txt"
    return score(WORD, await session.read_file(path)) if await session.file_exists(path) else 0.0
"""

TYPE_LINE = """
import shlex

import cua_bench as cb

from tasks.ale_test_config import LINUX, task_metadata

TITLE = "ALE Compat Line"
LINE = "hello ale"


@cb.tasks_config(split="train")
def load():
    metadata = task_metadata("gui", "type_line", requires_task_data=False)
    return [cb.Task(description=f"ALE-GUI: click into the {TITLE} window, type '{LINE}' and press Enter.",
                    metadata=metadata, computer=LINUX)]


@cb.setup_task(split="train")
async def start(task_cfg, session):
    out = task_cfg.metadata["remote_output_dir"] + "/line.txt"
    script = f"read line; printf '%s\\\\n' \\"$line\\" > {shlex.quote(out)}"
    argv = ["xterm", "-T", TITLE, "-geometry", "100x24+40+40", "-e", "sh", "-c", script]
    spawn = ("import subprocess as s, sys; s.Popen(sys.argv[1:], stdin=s.DEVNULL, stdout=s.DEVNULL, "
             "stderr=s.DEVNULL, start_new_session=True)")
    await session.run_command("export DISPLAY=${DISPLAY:-:0}; python3 -c " + shlex.quote(spawn) + " "
                              + " ".join(shlex.quote(a) for a in argv), check=True)
    wait = f"until [ -n \\"$(xdotool search --onlyvisible --name '^{TITLE}$' 2>/dev/null)\\" ]; do sleep 0.05; done"
    await session.run_command("export DISPLAY=${DISPLAY:-:0}; timeout 20 sh -c " + shlex.quote(wait), check=True)


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session):
    path = task_cfg.metadata["remote_output_dir"] + "/line.txt"
    if not await session.file_exists(path):
        return [0.0]
    return [1.0 if (await session.read_file(path)).strip() == LINE else 0.0]
"""

CRASH_EVAL = """
import cua_bench as cb

from tasks.ale_test_config import LINUX, task_metadata


@cb.tasks_config(split="train")
def load():
    metadata = task_metadata("demo", "crash_eval", requires_task_data=False)
    return [cb.Task(description="ALE-CRASH: nothing to do.", metadata=metadata, computer=LINUX)]


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session):
    raise ZeroDivisionError("the grader divides by zero on purpose")
"""

NO_DATA = """
import cua_bench as cb

from tasks.ale_test_config import LINUX, task_metadata


@cb.tasks_config(split="train")
def load():
    return [cb.Task(description="ALE-NODATA: never runs.", metadata=task_metadata("data", "no_data"), computer=LINUX)]


@cb.evaluate_task(split="train")
async def evaluate(task_cfg, session):
    return [1.0]
"""


def card(prompt: str, **vm: object) -> str:
    return json.dumps(
        {
            "taskId": prompt.lower().replace(" ", "-"),
            "title": prompt,
            "taskPrompt": prompt,
            "category": "test",
            "inputFiles": [{"name": "x", "format": "txt", "path": "input/x", "description": "unknown fields are kept"}],
            "vm": {"snapshot": "cpu-free-ubuntu", **vm},
        },
        indent=2,
    )


TASKS: dict[str, tuple[str, dict[str, str]]] = {
    "demo/secret_token": (SECRET_TOKEN, {}),
    "demo/upper_word": (UPPER_WORD, {"score_outputs.py": SCORE_UPPER}),
    "data/sum_numbers": (SUM_NUMBERS, {"score_outputs.py": SCORE_SUM}),
    "gui/type_line": (TYPE_LINE, {}),
    "demo/crash_eval": (CRASH_EVAL, {}),
    "data/no_data": (NO_DATA, {}),
}

AGENT = """
name: ale-scripted
deployer: {deployer}
executor: local
settings:
  call_timeout_s: 120
  plans:
    - match: 'ALE-SECRET'
      steps:
        - {{bridge: vm, tool: run_command, args: {{command: "cat {{input_dir}}/secret.txt"}}, save_as: token}}
        - {{bridge: vm, tool: write_text, args: {{path: "{{output_dir}}/answer.txt", content: "{{token}}\\n"}}}}
    - match: 'ALE-SUM'
      steps:
        - bridge: vm
          tool: read_text
          note: the hidden reference is not there while the agent runs
          args: {{path: "{{input_dir}}/../reference/expected.txt"}}
          expect_error: true
        - bridge: vm
          tool: run_command
          args: {{command: "awk '{{s += $1}} END {{print s}}' {{input_dir}}/numbers.txt"}}
          save_as: total
        - {{bridge: vm, tool: write_text, args: {{path: "{{output_dir}}/sum.txt", content: "{{total}}\\n"}}}}
    - match: 'ALE-UPPER'
      steps:
        - {{bridge: vm, tool: run_command, args: {{command: "tr a-z A-Z < {{input_dir}}/word.txt"}}, save_as: word}}
        - {{bridge: vm, tool: write_text, args: {{path: "{{output_dir}}/upper.txt", content: "{{word}}\\n"}}}}
    - match: 'ALE-GUI'
      steps:
        - {{bridge: cua, tool: screenshot}}
        - {{bridge: cua, tool: click, args: {{coordinate: [400, 300]}}, note: focus the xterm}}
        - {{bridge: cua, tool: type, args: {{text: "hello ale"}}}}
        - {{bridge: cua, tool: key, args: {{keys: [enter]}}}}
        - bridge: vm
          tool: run_command
          args:
            command: >-
              timeout 10 sh -c "until test -s {{output_dir}}/line.txt; do sleep 0.1; done"
              && cat {{output_dir}}/line.txt
    - match: 'ALE-CRASH'
      steps:
        - {{bridge: vm, tool: run_command, args: {{command: "true"}}}}
"""


def make_ale_lab(root: Path, tasks: list[str] | None = None) -> Path:
    """The tasks above under ``root/ale/tasks``, their data store, a task list and an agent preset;
    returns ``root``."""
    tasks_dir = root / "ale" / "tasks"
    tasks_dir.mkdir(parents=True)
    (tasks_dir / "ale_test_config.py").write_text(CONFIG)
    for ref in tasks if tasks is not None else list(TASKS):
        main, scripts = TASKS[ref]
        folder = tasks_dir / ref
        folder.mkdir(parents=True)
        (folder / "main.py").write_text(main)
        (folder / "task_card.json").write_text(card(ref, vcpus=1, memory_gb=1, timeout_s=240))
        if scripts:
            (folder / "scripts").mkdir()
            for name, text in scripts.items():
                (folder / "scripts" / name).write_text(text)
    data = root / "ale-data" / "data" / "sum_numbers" / "v1"
    for name, files in {
        "input": {"numbers.txt": "3\n4\n5\n"},
        "software": {"tool.txt": "a tool\n"},
        "reference": {"expected.txt": "12\n"},
    }.items():
        (data / name).mkdir(parents=True)
        for file, text in files.items():
            (data / name / file).write_text(text)
    (root / "ale" / "selected.txt").write_text(
        "# ALE-format test tasks\n" + "".join(f"{ref}\n" for ref in (tasks if tasks is not None else list(TASKS)))
    )
    deployer = REPO / "agents" / "scripted" / "deployer.py"
    (root / "ale-agent.yaml").write_text(AGENT.format(deployer=f"{deployer}:ScriptedDeployer"))
    return root
