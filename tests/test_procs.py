"""Process helpers: children that die with their parent, without Python between fork and exec."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from ale_iac import procs


def test_a_wrapped_child_dies_with_its_parent() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import os, subprocess, sys, time
                from ale_iac import procs
                child = subprocess.Popen(procs.die_with_parent_argv(["sleep", "600"], os.getpid()))
                print(child.pid, flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        started = procs.start_time(child)
        # Wait until the wrapper has exec'd into the command (so the death signal is set), or a
        # parent killed sooner would only test the guard.
        deadline = time.monotonic() + 10
        while procs.argv(child)[:1] != ["sleep"]:
            assert time.monotonic() < deadline, procs.argv(child)
            time.sleep(0.01)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    assert procs.wait_gone(child, started, 10), "the child outlived its SIGKILLed parent"


def test_a_child_whose_parent_is_already_gone_does_not_run() -> None:
    """The guard: when the death signal is set too late (the parent is someone else), exit at once."""
    done = subprocess.run(
        procs.die_with_parent_argv(["echo", "ran"], parent_pid=1), check=False, capture_output=True, text=True
    )
    assert done.returncode == 1 and done.stdout == ""


def test_the_wrapped_command_keeps_its_pid_and_exit_status() -> None:
    done = subprocess.run(procs.die_with_parent_argv(["sh", "-c", "kill -SEGV $$"], os.getpid()), check=False)
    assert done.returncode == -signal.SIGSEGV
