"""gui-notepad: type two lines into a GUI text editor and save them with Ctrl+S.

The "editor" is ALE Notepad (app/notepad.py) in an xterm at a fixed geometry. Nothing but key
presses that reach that window can produce its save: the grader checks the saved file, line by
line, against the hidden reference.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ale_iac.task import TaskSandbox

APP_SOURCE = Path(__file__).parent / "app" / "notepad.py"
WINDOW_TITLE = "ALE Notepad"
# 100x24 cells of DejaVu Sans Mono 11 at +40+40: about 40..950 x 40..480 px on a 1280x800 screen, so
# the normalized point [400, 300] the demo plan clicks is inside it on any screen of 1024x600 or more.
GEOMETRY = "100x24+40+40"
OUTPUT_NAME = "note.txt"
READY_TIMEOUT_S = 20
# The app writes its pid here once it accepts input. Outside the task dir on purpose: the runner wipes
# that dir before setup, and on a reused sandbox setup must still find (and stop) an earlier instance.
PID_FILE = "/tmp/ale-demo-gui-notepad.pid"


async def setup(sandbox: TaskSandbox) -> None:
    """Open ALE Notepad on an empty document and wait until it accepts keystrokes."""
    app_dir = f"{sandbox.task_dir}/app"
    q_app, q_ready, q_out = shlex.quote(app_dir), shlex.quote(PID_FILE), shlex.quote(sandbox.output_dir)
    # A known state even on a reused sandbox: no earlier notepad, no stale output.
    await sandbox.stop_pidfile(PID_FILE)
    await sandbox.run_ok(f"rm -rf {q_app} {q_out}/{OUTPUT_NAME}; mkdir -p {q_app} {q_out}")
    await sandbox.write_text(f"{app_dir}/notepad.py", APP_SOURCE.read_text())
    # allowTitleOps off keeps the title fixed; allowSendEvents is set image-wide (the server types
    # with XSendEvent, which xterm ignores otherwise).
    xterm = [
        "xterm", "-T", WINDOW_TITLE, "-geometry", GEOMETRY, "-xrm", "XTerm*allowTitleOps: false",
        "-e", sandbox.handle.paths.python, f"{app_dir}/notepad.py", f"{sandbox.output_dir}/{OUTPUT_NAME}", PID_FILE,
    ]  # fmt: skip
    # Ready = the window is mapped and the program has put its terminal in raw mode.
    await sandbox.launch(xterm, window=WINDOW_TITLE, timeout=READY_TIMEOUT_S)
    await sandbox.run_ok(
        f"timeout {READY_TIMEOUT_S} sh -c {shlex.quote(f'until test -s {q_ready}; do sleep 0.05; done')}",
        timeout=READY_TIMEOUT_S + 10,
    )


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


async def evaluate(sandbox: TaskSandbox) -> float:
    """Fraction of the expected lines saved at the right position (extra lines count against it)."""
    expected = _lines(await sandbox.read_text(f"{sandbox.reference_dir}/{OUTPUT_NAME}"))
    saved = f"{sandbox.output_dir}/{OUTPUT_NAME}"
    if not await sandbox.exists(saved):
        return 0.0
    got = _lines(await sandbox.read_text(saved))
    if not expected:
        return 1.0 if not got else 0.0
    matches = sum(1 for want, have in zip(expected, got, strict=False) if want == have)
    return matches / max(len(expected), len(got))
