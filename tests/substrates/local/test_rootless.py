"""The ``local`` profile as a normal user (rootless), through the real command line.

A user made by the session (``tests/support/rootless.py``: useradd, runuser, a private mount namespace
that lends it root's checkout, venv and Pulumi toolchain) runs ``ale-iac doctor`` and ``ale-iac sandbox
create/env/destroy`` with the real Pulumi engine; this test, as root, drives the sandbox through its
endpoint and checks from the host that nothing of it is left. The isolation suite runs against a
rootless sandbox too (``tests/substrates/test_isolation.py``, ``local-rootless``), and so does
``ale-iac evaluate`` (``tests/runner/test_evaluate_rootless.py``).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest

from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.substrates.local import host as local_host
from ale_iac.substrates.local import sandboxes as local_sandboxes
from tests.support.rootless import HostUser

pytestmark = [pytest.mark.rootless, pytest.mark.engine, pytest.mark.timeout(300)]


def ale_iac(user: HostUser, *args: str) -> tuple[int, str, str]:
    done = user.run([sys.executable, "-m", "ale_iac", *args], timeout=240)
    return done.returncode, done.stdout, done.stderr


def test_doctor_says_what_a_normal_user_can_do(rootless_user: HostUser) -> None:
    code, out, err = ale_iac(rootless_user, "doctor")
    assert code == 0, out + err
    assert re.search(rf"local: mode\s.*rootless \(uid {rootless_user.uid}\)", out), out
    assert re.search(r"local: overlay in a user namespace\s.*yes", out), out
    assert re.search(r"local: subordinate ids\s.*yes", out), out  # setup.sh installs uidmap; useradd gives a range
    assert re.search(r"local: limit pids_limit\s.*yes\s.*RLIMIT_NPROC", out), out
    assert "local: loop devices" not in out and "the `local` profile can run here" in out


def test_create_command_screenshot_and_destroy_as_a_normal_user(rootless_user: HostUser) -> None:
    code, out, err = ale_iac(rootless_user, "sandbox", "create", "--profile", "local", "--json")
    assert code == 0, out + err
    handle = json.loads(out)
    stack = handle["stack"]
    try:
        code, exported, err = ale_iac(rootless_user, "sandbox", "env", stack)
        assert code == 0, err
        variables = dict(re.findall(r"^export (\w+)=(\S+)$", exported, re.MULTILINE))
        states = local_sandboxes.list_sandboxes(home=rootless_user.ale_home)
        assert [s.mode for s in states] == [local_host.MODE_ROOTLESS], states
        assert states[0].uid_base == rootless_user.uid

        async def use() -> tuple[str, bytes]:
            async with ComputerServerClient(
                variables["ALE_IAC_ENDPOINT"], token=variables["ALE_IAC_ENDPOINT_TOKEN"]
            ) as c:
                said = (await c.run_command("id -u; cat /proc/self/uid_map | head -1")).stdout
                return said, await c.screenshot()

        said, png = asyncio.run(use())
        assert said.split()[:4] == ["0", "0", str(rootless_user.uid), "1"], said
        assert png.startswith(b"\x89PNG") and len(png) > 1000
    finally:
        code, out, err = ale_iac(rootless_user, "sandbox", "destroy", stack)
    assert code == 0 and f"destroyed {stack}" in out, out + err
    # Nothing is left: no sandbox, no process of the user, nothing for gc.
    assert local_sandboxes.list_sandboxes(home=rootless_user.ale_home) == []
    assert rootless_user.processes() == []
    code, out, err = ale_iac(rootless_user, "gc", "--dry-run")
    assert code == 0 and "nothing to collect" in out, out + err


def test_a_rootless_sandbox_refuses_an_image_the_user_does_not_own(rootless_user: HostUser) -> None:
    """An image root built (root-owned files) would be all 'nobody' inside: refused, with the way out."""
    out = rootless_user.python(
        "import pathlib\n"
        "from ale_iac.substrates.local import runtime, sandboxes\n"
        "try:\n"
        "    runtime.check_rootfs_owner(pathlib.Path('/'))\n"
        "except sandboxes.SandboxError as exc:\n"
        "    print(exc)\n"
    )
    assert "rootless sandboxes run an image of your own, and / belongs to uid 0" in out, out


def test_the_users_copy_of_the_published_image_is_its_own_and_has_no_setuid_file(rootless_user: HostUser) -> None:
    """What root published (a tar: /etc/shadow and /root are root's alone in the build) is unpacked into the
    user's cache as files of the user's, in a 0700 folder, without setuid or setgid bits."""
    (folder,) = [p for p in (rootless_user.home / ".cache/ale-iac/images").iterdir() if not p.name.startswith(".")]
    assert folder.stat().st_uid == rootless_user.uid and folder.stat().st_mode & 0o777 == 0o700
    rootfs = folder / "rootfs"
    for path in (rootfs, rootfs / "etc/shadow", rootfs / "root", rootfs / "usr/bin/passwd"):
        assert path.lstat().st_uid == rootless_user.uid, path
    assert (rootfs / "usr/bin/passwd").stat().st_mode & 0o6000 == 0
    setuid = subprocess.run(
        ["find", str(rootfs), "-xdev", "-perm", "/6000", "-type", "f"], capture_output=True, text=True, check=True
    )
    assert setuid.stdout == ""
