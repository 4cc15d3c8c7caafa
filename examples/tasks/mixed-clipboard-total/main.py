"""mixed-clipboard-total: compute a total with the shell, then move it through the clipboard into a GUI form.

The form (app/form.py in an xterm) turns on bracketed paste, so it knows whether its value arrived
as a paste from the clipboard or as typed keys; it mirrors its field in app/draft.txt (xterm pastes
asynchronously, so a script must see the paste land before it presses Enter). Four checks, a
quarter of the score each:

1. total.txt in the output folder holds the right total (CLI);
2. the clipboard holds it (read back with xclip);
3. the form received it (form.json, written only by the form on Enter);
4. the form received it entirely as a paste (no typed characters).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ale_iac.task import TaskSandbox

APP_SOURCE = Path(__file__).parent / "app" / "form.py"
WINDOW_TITLE = "ALE Form"
# 80x12 cells at +120+120: about 120..850 x 120..360 px on a 1280x800 screen, so the normalized point
# [400, 300] the demo plan clicks is inside it.
GEOMETRY = "80x12+120+120"
# xterm pastes PRIMARY by default; the instruction promises Shift+Insert pastes the clipboard.
PASTE_TRANSLATIONS = (
    "XTerm*VT100.translations: #override \\n"
    "Shift <Key>Insert: insert-selection(CLIPBOARD) \\n"
    "Ctrl Shift <Key>V: insert-selection(CLIPBOARD)"
)
READY_TIMEOUT_S = 20
# The app writes its pid here once it accepts input. Outside the task dir on purpose: the runner wipes
# that dir before setup, and on a reused sandbox setup must still find (and stop) an earlier instance.
PID_FILE = "/tmp/ale-demo-mixed-clipboard-total.pid"


async def setup(sandbox: TaskSandbox) -> None:
    """Empty output and clipboard, then open ALE Form and wait until it accepts input."""
    app_dir = f"{sandbox.task_dir}/app"
    q_app, q_ready, q_out = shlex.quote(app_dir), shlex.quote(PID_FILE), shlex.quote(sandbox.output_dir)
    orders = shlex.quote(f"{sandbox.input_dir}/orders.csv")
    await sandbox.run_ok(f"test -s {orders} || {{ echo 'orders.csv was not staged' >&2; exit 1; }}")
    await sandbox.stop_pidfile(PID_FILE)
    await sandbox.run_ok(f"rm -rf {q_app} {q_out}; mkdir -p {q_app} {q_out}")
    await sandbox.client.set_clipboard("")
    await sandbox.write_text(f"{app_dir}/form.py", APP_SOURCE.read_text())
    xterm = [
        "xterm", "-T", WINDOW_TITLE, "-geometry", GEOMETRY, "-xrm", "XTerm*allowTitleOps: false",
        "-xrm", PASTE_TRANSLATIONS,
        "-e", sandbox.handle.paths.python, f"{app_dir}/form.py", f"{sandbox.output_dir}/form.json", PID_FILE,
        f"{app_dir}/draft.txt",
    ]  # fmt: skip
    await sandbox.launch(xterm, window=WINDOW_TITLE, timeout=READY_TIMEOUT_S)
    wait_ready = shlex.quote(f"until test -s {q_ready}; do sleep 0.05; done")
    await sandbox.run_ok(f"timeout {READY_TIMEOUT_S} sh -c {wait_ready}", timeout=READY_TIMEOUT_S + 10)


async def _read_if_exists(sandbox: TaskSandbox, path: str) -> str | None:
    return await sandbox.read_text(path) if await sandbox.exists(path) else None


async def evaluate(sandbox: TaskSandbox) -> float:
    reference = json.loads(await sandbox.read_text(f"{sandbox.reference_dir}/expected.json"))
    total = str(reference["total"])
    score = 0.0

    written = await _read_if_exists(sandbox, f"{sandbox.output_dir}/total.txt")
    if written is not None and written.strip() == total:
        score += 0.25

    clipboard = await sandbox.run("DISPLAY=${DISPLAY:-:0} xclip -o -selection clipboard", timeout=20)
    if clipboard.exit_code == 0 and clipboard.stdout.strip() == total:
        score += 0.25

    form_text = await _read_if_exists(sandbox, f"{sandbox.output_dir}/form.json")
    try:
        form = json.loads(form_text) if form_text is not None else {}
    except json.JSONDecodeError:
        form = {}
    if isinstance(form, dict) and str(form.get("value", "")).strip() == total:
        score += 0.25
        if form.get("typed_chars") == 0 and int(form.get("pasted_chars", 0)) > 0:
            score += 0.25
    return score
