"""Per-unit overhead of a task in ALE's format (cua-bench) against one in this project's format.

    .venv/bin/python bench/bench_ale_tasks.py [--runs 20]

Starts one ``local`` sandbox from the ``desktop`` image and stops it at the end. Two comparable tasks,
each with inputs, a setup check, a hidden reference and an evaluate that reads it: this project's 6*7
task (``tests/support/tasks.py``) and ALE's ``data/sum_numbers`` (``tests/support/ale_tasks.py``: task
data from a store, ``software/`` too, a helper module in ``scripts/``). Per format, alternating:

* load: import ``main.py`` and read the card (done once per run by ``ale-iac evaluate``, shown per task);
* unit: ``for_unit`` (ALE: ``load()``) + ``bind`` + stage inputs + setup + stage reference + evaluate
  against the sandbox, i.e. everything the runner does per unit around the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ale_iac.image_build import build_image  # noqa: E402
from ale_iac.runner.ale_tasks import LocalTaskData, load_ale_task  # noqa: E402
from ale_iac.runner.tasks import Task, UnitTask, load_task  # noqa: E402
from ale_iac.sandbox.handle import SandboxHandle  # noqa: E402
from ale_iac.substrates.local import runtime as local_runtime  # noqa: E402
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec  # noqa: E402
from tests.support.ale_tasks import make_ale_lab  # noqa: E402
from tests.support.sandbox import handle_of, wait_for_status  # noqa: E402
from tests.support.tasks import make_task  # noqa: E402


async def one_unit(task: Task, handle: SandboxHandle, answer: Callable[[UnitTask], tuple[str, str]]) -> float:
    async with handle.client() as client:
        started = time.perf_counter()
        unit = task.for_unit()
        sandbox = unit.bind(handle, client)
        await unit.stage_inputs(sandbox)
        setup = unit.hook("setup")
        if setup is not None:
            await setup(sandbox)
        path, text = answer(unit)
        agent = time.perf_counter()
        await client.write_text(f"{getattr(sandbox, path)}/{text}", text)  # the "agent", not timed
        paused = time.perf_counter() - agent
        await unit.stage_reference(sandbox)
        evaluate = unit.hook("evaluate")
        assert evaluate is not None
        await evaluate(sandbox)
        return time.perf_counter() - started - paused


def ms(values: list[float]) -> str:
    p90 = sorted(values)[int(len(values) * 0.9)]
    return f"median {statistics.median(values) * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ale-"))
    make_task(work / "own", "answer")
    make_ale_lab(work / "lab", tasks=["data/sum_numbers"])
    store = LocalTaskData(work / "lab" / "ale-data")
    ale_folder = work / "lab" / "ale" / "tasks" / "data" / "sum_numbers"
    loads: dict[str, list[float]] = {"own": [], "ale": []}
    loaders: list[tuple[str, Callable[[], Task]]] = [
        ("own", lambda: load_task(work / "own" / "answer")),
        ("ale", lambda: load_ale_task(ale_folder, store)),
    ]
    for _ in range(args.runs):
        for kind, load in loaders:
            started = time.perf_counter()
            load()
            loads[kind].append(time.perf_counter() - started)
    own, ale = load_task(work / "own" / "answer"), load_ale_task(ale_folder, store)
    image = build_image("desktop")
    state = local_runtime.start(LocalSandboxSpec(sandbox_id=f"bench-{int(time.time())}", rootfs=str(image.rootfs)))
    units: dict[str, list[float]] = {"own": [], "ale": []}
    try:
        wait_for_status(state)
        handle = handle_of(state)
        for run in range(args.runs + 2):
            for kind, task, answer in (
                ("own", own, lambda _u: ("output_dir", "answer.txt")),
                ("ale", ale, lambda _u: ("output_dir", "sum.txt")),
            ):
                seconds = asyncio.run(one_unit(task, handle, answer))
                if run >= 2:  # two warm-up rounds
                    units[kind].append(seconds)
    finally:
        local_runtime.stop(state.sandbox_id)
    print(f"{args.runs} runs per format, one local sandbox")
    for kind, label in (("own", "this project's format"), ("ale", "ALE's format")):
        print(f"  {label:22} load {ms(loads[kind])}   unit {ms(units[kind])}")


if __name__ == "__main__":
    main()
