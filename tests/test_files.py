"""Private folders for secrets a child reads: what a killed process leaves, gc removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ale_iac.files import PrivateDir, sweep_private_dirs

REPO = Path(__file__).resolve().parent.parent
WRITER = (
    "import sys; from ale_iac.files import PrivateDir; d = PrivateDir(sys.argv[1]); "
    "print(d.write('token', 's3cret'), flush=True); sys.stdin.read()"
)


def test_the_folder_of_a_killed_process_is_swept_and_a_live_ones_is_not(tmp_path: Path) -> None:
    mine = PrivateDir(str(tmp_path))
    kept = mine.write("token", "still-used")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    left = Path(writer.stdout.readline().strip())
    assert left.read_text() == "s3cret" and oct(left.parent.stat().st_mode & 0o777) == "0o700"
    os.kill(writer.pid, signal.SIGKILL)  # no finalizer runs
    writer.wait()
    assert writer.stdin is not None
    writer.stdin.close()
    writer.stdout.close()
    assert left.exists()

    assert sweep_private_dirs(tmp_path, dry_run=True) == [left.parent]
    assert left.exists()
    assert sweep_private_dirs(tmp_path) == [left.parent]
    assert not left.parent.exists()
    assert kept.read_text() == "still-used" and sweep_private_dirs(tmp_path) == []
    mine.remove()
    assert not kept.parent.exists()
