"""The egress proxy process on its own (no unit): a leftover of a SIGKILLed runner is found and swept, the
socket it serves is private, and a bad policy file fails before it listens."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import psutil

from ale_iac import procs
from ale_iac.substrates import egress

RUNNER = """
import asyncio, json, sys
from pathlib import Path
from ale_iac.egress_policy import EgressPolicy
from ale_iac.substrates.egress import UnitEgress
unit = UnitEgress("http://127.0.0.1:9", "x" * 32, EgressPolicy(allow=["allowed.test"]), root=Path(sys.argv[1]))
unit._start_proxy()  # the proxy alone: this runner is killed before it opens any channel
unit._wait_ready()
print(json.dumps([str(unit.folder), unit.proc.pid]), flush=True)
sys.stdin.read()
"""


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of the group ``pgid``."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except ProcessLookupError:
            continue
    return found


def test_a_sigkilled_runners_proxy_is_found_and_swept(tmp_path: Path) -> None:
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert runner.stdout is not None
        folder_text, pid = json.loads(runner.stdout.readline())
        folder = Path(folder_text)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert folder not in egress.leftovers(tmp_path)  # its runner lives
        assert _group(pid)
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    assert procs.wait_gone(pid, None, 10)  # the proxy dies with its runner
    assert egress.leftovers(tmp_path) == [folder]
    egress.sweep(folder)
    assert not folder.exists()
    assert _group(pid) == []  # proxy.py's acceptor went with its group


def test_a_bad_policy_file_fails_before_the_proxy_listens(tmp_path: Path) -> None:
    (tmp_path / "policy.json").write_text(json.dumps({"allow": ["1.2.3.4"]}))
    argv = [sys.executable, "-m", "ale_iac.substrates.egress_proxy", "--policy", str(tmp_path / "policy.json")]
    done = subprocess.run(
        [*argv, "--socket", str(tmp_path / "s"), "--log", str(tmp_path / "l")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "is an IP address where a domain is expected" in done.stderr
    assert not (tmp_path / "s").exists()
