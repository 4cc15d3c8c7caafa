"""The ``local`` sandbox runtime, with real processes: bubblewrap, the computer-server, slirp4netns.

What a hostile agent must not be able to do from inside is in ``tests/substrates/test_isolation.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ale_iac import procs
from ale_iac.images import ImageInfo
from ale_iac.substrates.local import host as local_host
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec, LocalSandboxState, SandboxError
from ale_iac.task import wait_for_window
from tests.support.sandbox import (
    Endpoint,
    SandboxFactory,
    Target,
    assert_nothing_left,
    cmd,
    listening_addresses,
    mounts_mentioning,
    processes_mentioning,
    run,
    sandbox_home,
    wait_for_status,
)

# --- helpers -------------------------------------------------------------------------------------


@contextlib.contextmanager
def host_listener() -> Iterator[socket.socket]:
    """A TCP listener on the host's 127.0.0.1 (what a sandbox must never reach)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        yield server


def connect_from_sandbox(endpoint: Target, host: str, port: int) -> dict[str, object]:
    """Try a TCP connect from inside the sandbox; returns the run_command reply."""
    script = (
        "import socket,sys\n"
        "try:\n"
        f"    socket.create_connection(({host!r}, {port}), timeout=3).close()\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('failed', exc); sys.exit(3)\n"
    )
    return run(endpoint, f'python3 -c "{script}"')


def accepted_anything(server: socket.socket) -> bool:
    try:
        conn, _ = server.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


@contextlib.contextmanager
def netns_listener() -> Iterator[tuple[str, int, Callable[[], bool]]]:
    """A TCP listener in a network namespace of the test's own, behind a veth pair on a 198.18.0.0/15
    (benchmarking) /30: the only place an outbound-enabled sandbox is sent in these tests.

    Yields (address, port, accepted): ``accepted()`` waits up to 10 s for the listener's first connection.
    """
    tag = secrets.token_hex(3)
    name, host_if, ns_if = f"ale-t-{tag}", f"vh{tag}", f"vn{tag}"
    subnet = f"198.18.{secrets.randbelow(256)}"
    port = 18000 + secrets.randbelow(1000)
    setup = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if],
        ["ip", "link", "set", ns_if, "netns", name],
        ["ip", "addr", "add", f"{subnet}.1/30", "dev", host_if],
        ["ip", "link", "set", host_if, "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", f"{subnet}.2/30", "dev", ns_if],
        ["ip", "netns", "exec", name, "ip", "link", "set", ns_if, "up"],
    ]
    listener: subprocess.Popen[str] | None = None
    try:
        for argv in setup:
            subprocess.run(argv, check=True, capture_output=True)
        script = (
            "import socket\n"
            f"s = socket.create_server(({subnet + '.2'!r}, {port}))\n"
            "print('listening', flush=True)\n"
            "s.accept()\n"
            "print('accepted', flush=True)\n"
        )
        listener = subprocess.Popen(
            ["ip", "netns", "exec", name, sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
        )
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"

        def accepted() -> bool:
            assert listener is not None and listener.stdout is not None
            ready, _, _ = select.select([listener.stdout], [], [], 10)
            return bool(ready) and listener.stdout.readline().strip() == "accepted"

        yield f"{subnet}.2", port, accepted
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


# --- no running sandbox (marked: the host must be able to run one; start() checks that first) ----


@pytest.mark.sandbox
def test_invalid_sandbox_id_is_refused(tmp_path: Path) -> None:
    spec = LocalSandboxSpec(sandbox_id="Bad_ID!", rootfs=str(tmp_path))
    with pytest.raises(SandboxError, match="invalid sandbox id"):
        local_runtime.start(spec)


@pytest.mark.sandbox
def test_missing_rootfs_is_a_clear_error(tmp_path: Path) -> None:
    spec = LocalSandboxSpec(sandbox_id="no-rootfs", rootfs=str(tmp_path / "nope"))
    with pytest.raises(SandboxError, match="does not exist; build the image first"):
        local_runtime.start(spec)
    assert local_sandboxes.list_sandboxes() == []


def test_missing_tool_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "slirp4netns" else real_which(tool))
    local_host.check_host.cache_clear()
    try:
        with pytest.raises(SandboxError, match=r"slirp4netns: not installed \(apt-get install -y slirp4netns\)"):
            local_host.check_host()
    finally:
        local_host.check_host.cache_clear()


@pytest.mark.sandbox
def test_the_host_checks_pass_here() -> None:
    """``ale-iac doctor`` prints this same list (tests/cli: doctor says local can run)."""
    assert all(check.ok for check in local_host.host_checks()), local_host.host_checks()


def test_a_normal_user_gets_the_rootless_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a normal user the runtime runs rootless: no loop device or mkfs, but user namespaces and
    overlayfs in one (the probe really tries them), and each limit says what it will be."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    checks = {check.name: check for check in local_host.host_checks()}
    assert checks["mode"].detail.startswith("rootless (uid 1000)")
    assert not {"mkfs.ext4", "loop devices", "ext4 file system"} & set(checks)
    assert {"user namespaces", "overlay in a user namespace", "limit memory_gb", "limit pids_limit"} <= set(checks)
    assert all(not check.required for name, check in checks.items() if name.startswith("limit ") or name == "cgroups")


def test_disabled_user_namespaces_are_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    real = local_host._sysctl
    monkeypatch.setattr(local_host, "_sysctl", lambda name: "0" if name == "user.max_user_namespaces" else real(name))
    local_host.check_host.cache_clear()
    try:
        with pytest.raises(
            SandboxError,
            match=r"user namespaces: user.max_user_namespaces=0 \(sysctl -w user.max_user_namespaces=15000\)",
        ):
            local_host.check_host()
    finally:
        local_host.check_host.cache_clear()


def test_rootless_refuses_an_image_it_does_not_own(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    with pytest.raises(SandboxError, match=r"rootless sandboxes run an image of your own, and .* belongs to uid"):
        local_runtime.check_rootfs_owner(tmp_path)


@pytest.mark.sandbox
def test_a_setup_failure_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    """The supervisor's error reaches start(), with its log, and nothing is left behind."""
    rootfs = tmp_path / "not-an-image"  # an init, but none of the image's conventions
    (rootfs / "usr/local/sbin").mkdir(parents=True)
    (rootfs / "usr/local/sbin/ale-init").write_text("#!/bin/sh\n")
    spec = LocalSandboxSpec(sandbox_id="setup-fails", rootfs=str(rootfs))
    with pytest.raises(SandboxError) as info:
        local_runtime.start(spec)
    message = str(info.value)
    assert "sandbox setup-fails failed to start" in message
    assert "the image has no /var/log/ale; is it an ale-iac image?" in message
    assert "--- supervisor.log ---" in message
    assert local_sandboxes.list_sandboxes() == []
    assert not processes_mentioning("setup-fails")
    assert not mounts_mentioning(str(rootfs))


def test_stop_of_unknown_sandbox_is_a_no_op() -> None:
    assert local_runtime.stop("never-started") is False


# --- one shared sandbox --------------------------------------------------------------------------


@pytest.mark.sandbox
def test_status_and_run_command(local_sandbox: LocalSandboxState) -> None:
    import httpx

    status = httpx.get(f"{local_sandbox.endpoint}/status", timeout=10, headers=Endpoint.of(local_sandbox).headers)
    assert status.status_code == 200
    assert status.json()["status"] == "ok"
    reply = run(local_sandbox, "echo hello; id -u; hostname")
    assert reply["success"] is True
    assert reply["return_code"] == 0
    assert reply["stdout"] == f"hello\n0\n{local_sandbox.sandbox_id}\n"
    assert cmd(local_sandbox, "version")["package"] == "0.3.46"


@pytest.mark.sandbox
def test_path_conventions_exist(local_sandbox: LocalSandboxState) -> None:
    reply = run(
        local_sandbox,
        "test -d /root/.ale && test -d /data/tasks && test -x /usr/bin/python3 && pwd && echo $HOME",
    )
    assert reply["return_code"] == 0, reply
    assert reply["stdout"] == "/root\n/root\n"


@pytest.mark.sandbox
def test_server_environment_is_clean(local_sandbox: LocalSandboxState) -> None:
    reply = run(local_sandbox, "env")
    assert "CONTAINER_NAME" not in reply["stdout"]
    assert "CUA_TELEMETRY=0" in reply["stdout"]


@pytest.mark.sandbox
def test_a_background_program_does_not_hold_run_command(local_sandbox: LocalSandboxState) -> None:
    reply = cmd(local_sandbox, "run_command", {"command": "sleep 60 >/dev/null 2>&1 & echo $!", "timeout": 10})
    assert reply["success"] is True and reply["return_code"] == 0, reply
    assert run(local_sandbox, f"kill {int(reply['stdout'])}")["return_code"] == 0


@pytest.mark.sandbox
def test_state_is_listed_and_alive(local_sandbox: LocalSandboxState) -> None:
    listed = local_sandboxes.list_sandboxes(home=sandbox_home(local_sandbox))
    assert [s.sandbox_id for s in listed] == [local_sandbox.sandbox_id]
    state = listed[0]
    assert local_sandboxes.is_alive(state)
    assert state.phase == "running"
    assert state.endpoint == f"http://127.0.0.1:{state.host_port}"
    assert state.labels == {"purpose": "pytest-session"}
    assert state.init_pid is not None and state.init_pid in local_sandboxes.sandbox_pids(state)
    # A recycled pid is not the supervisor: same pid, other start time.
    impostor = LocalSandboxState(**{**state.to_json(), "supervisor_start_time": 1, "limits": []})
    assert not local_sandboxes.is_alive(impostor)


@pytest.mark.sandbox
def test_rootfs_stays_unmodified(local_sandbox: LocalSandboxState, desktop_image: ImageInfo) -> None:
    reply = run(local_sandbox, "echo changed > /etc/x && rm /etc/hostname && cat /etc/x")
    assert reply["return_code"] == 0, reply
    assert reply["stdout"] == "changed\n"
    assert not (desktop_image.rootfs / "etc" / "x").exists()
    assert (desktop_image.rootfs / "etc" / "hostname").exists()
    # The change lives in the sandbox's own file system, seen only through its mount namespace.
    upper = Path(f"/proc/{local_sandbox.supervisor_pid}/root{local_sandboxes.MOUNT_ROOT}/layer/upper/etc")
    assert (upper / "x").read_text() == "changed\n"
    assert not list(Path(local_sandbox.state_dir).rglob("x"))


@pytest.mark.sandbox
def test_the_image_s_font_caches_are_current(local_sandbox: LocalSandboxState) -> None:
    """A stale cache in the image makes every sandbox rescan that font folder when its desktop starts (openbox's
    start took 0.26 CPU-s so, 0.02 with the caches current); ``fc-list`` loads them all."""
    reply = run(local_sandbox, "fc-list >/dev/null && echo listed")
    assert reply["stdout"] == "listed\n", reply
    layer = Path(f"/proc/{local_sandbox.supervisor_pid}/root{local_sandboxes.MOUNT_ROOT}/layer/upper")
    assert layer.is_dir()
    caches = layer / "var" / "cache" / "fontconfig"
    written = sorted(path.name for path in caches.iterdir()) if caches.is_dir() else []
    assert written == [], f"the sandbox rebuilt font caches its image should hold: {written}"


@pytest.mark.sandbox
def test_sandbox_cannot_reach_host_loopback(local_sandbox: LocalSandboxState) -> None:
    with host_listener() as server:
        port = server.getsockname()[1]
        via_gateway = connect_from_sandbox(local_sandbox, "10.0.2.2", port)
        own_loopback = connect_from_sandbox(local_sandbox, "127.0.0.1", port)
        assert not accepted_anything(server)
    assert via_gateway["return_code"] == 3, via_gateway
    assert own_loopback["return_code"] == 3, own_loopback


@pytest.mark.sandbox
def test_no_outbound_network_by_default(local_sandbox: LocalSandboxState) -> None:
    links = run(local_sandbox, "ip -o link")["stdout"].splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"], links
    assert run(local_sandbox, "ip route")["stdout"].strip() == ""
    # Nothing answers for the sandbox on the host: no slirp4netns, no other helper.
    names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in local_sandboxes.sandbox_pids(local_sandbox)}
    assert "slirp4netns" not in names, names
    reply = connect_from_sandbox(local_sandbox, "192.0.2.1", 80)  # TEST-NET-1: fails before any packet
    assert reply["return_code"] == 3, reply
    assert "unreachable" in str(reply["stdout"]).lower()
    # Root inside cannot make itself a network device or a route: no CAP_NET_ADMIN.
    add_link = run(local_sandbox, "ip link add dummy0 type dummy")
    assert add_link["return_code"] != 0
    assert "not permitted" in str(add_link["stderr"]).lower()


@pytest.mark.sandbox
def test_endpoint_listens_on_host_loopback_only(local_sandbox: LocalSandboxState) -> None:
    addresses = listening_addresses(local_sandbox.host_port)
    assert addresses == ["0100007F"], addresses  # 127.0.0.1, and nothing on 0.0.0.0 or ::
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        external = probe.getsockname()[0]
    if external.startswith("127."):
        pytest.skip("the host has no non-loopback address to try")
    with pytest.raises(OSError):
        socket.create_connection((external, local_sandbox.host_port), timeout=3).close()


@pytest.mark.sandbox
def test_type_text_reaches_an_xterm(local_sandbox: LocalSandboxState) -> None:
    """The image's openbox + XTerm*allowSendEvents make pynput's XSendEvent typing work."""
    endpoint = local_sandbox
    xterm_args = ["-geometry", "80x24+100+100", "-title", "typing-test"]
    launched = cmd(endpoint, "launch", {"app": "xterm", "args": xterm_args})
    assert launched["success"], launched
    found = run(endpoint, f"{wait_for_window('typing-test', 20)} && xdotool search --onlyvisible --name typing-test")
    assert found["return_code"] == 0 and found["stdout"].strip(), found
    try:
        assert cmd(endpoint, "left_click", {"x": 300, "y": 200})["success"]
        focus = run(endpoint, "xdotool getwindowfocus getwindowname")
        assert focus["stdout"].strip() == "typing-test", focus
        assert cmd(endpoint, "type_text", {"text": "echo typed-ü > /tmp/typed"})["success"]
        assert cmd(endpoint, "press_key", {"key": "enter"})["success"]
        typed = run(endpoint, "timeout 20 sh -c 'until test -s /tmp/typed; do sleep 0.1; done'; cat /tmp/typed")
        assert typed["stdout"] == "typed-ü\n", typed
    finally:
        run(endpoint, f"kill {launched['pid']}")


# --- sandboxes of their own ----------------------------------------------------------------------


@pytest.mark.sandbox
def test_two_sandboxes_are_isolated(local_sandbox: LocalSandboxState, sandbox_factory: SandboxFactory) -> None:
    other = sandbox_factory()
    marker = f"/root/marker-{other.sandbox_id}"
    assert run(other, f"echo mine > {marker}")["return_code"] == 0
    assert run(local_sandbox, f"test -e {marker}")["return_code"] != 0
    assert run(other, f"cat {marker}")["stdout"] == "mine\n"
    # Separate PID namespaces: each sees its own init as PID 1 and not the other's processes.
    ps_other = run(other, "ps -eo pid,args")["stdout"]
    ps_local = run(local_sandbox, "ps -eo pid,args")["stdout"]
    assert "1 /usr/bin/python3 /usr/local/sbin/ale-init" in ps_other
    assert "marker" not in ps_local
    assert other.host_port != local_sandbox.host_port


@pytest.mark.sandbox
def test_outbound_when_allowed_but_never_host_loopback(sandbox_factory: SandboxFactory) -> None:
    """Outbound goes through slirp4netns to wherever the host routes: here a namespace of the test's own."""
    sandbox = sandbox_factory(allow_outbound=True)
    assert "default via 10.0.2.2" in run(sandbox, "ip route")["stdout"]
    assert run(sandbox, "cat /etc/resolv.conf")["stdout"] == "nameserver 10.0.2.3\n"
    with netns_listener() as (address, port, accepted):
        reply = connect_from_sandbox(sandbox, address, port)
        assert reply["return_code"] == 0, reply
        assert accepted(), "the listener in the test's namespace saw no connection"
    with host_listener() as server:
        blocked = connect_from_sandbox(sandbox, "10.0.2.2", server.getsockname()[1])
        assert not accepted_anything(server)
    assert blocked["return_code"] == 3, blocked


@pytest.mark.sandbox
def test_limits_are_applied_and_recorded(sandbox_factory: SandboxFactory) -> None:
    sandbox = sandbox_factory(vcpus=1, memory_gb=1.5, pids_limit=512, disk_gb=2)
    limits = {record.name: record for record in sandbox.limits}
    assert set(limits) == {"vcpus", "memory_gb", "pids_limit", "disk_gb"}, limits
    expected = {
        "memory_gb": ("memory.limit_in_bytes", str(int(1.5 * 2**30))),
        "pids_limit": ("pids.max", "512"),
        "vcpus": ("cpu.cfs_quota_us", "100000"),
    }
    cpus = len(os.sched_getaffinity(0))
    for name, (key, value) in expected.items():
        record = limits[name]
        if name == "vcpus" and cpus <= 1:
            assert not record.applied and "not restricted" in record.detail
            continue
        assert record.applied, record
        folder = next(Path(p) for p in sandbox.cgroups if (Path(p) / key).exists())
        assert (folder / key).read_text().strip() == value
        members = {int(pid) for pid in (folder / "cgroup.procs").read_text().split()}
        assert sandbox.init_pid in members
    size = run(sandbox, "df -B1 --output=size / | tail -1")["stdout"].strip()
    assert 1.8 * 2**30 < int(size) <= 2 * 2**30, size


@pytest.mark.sandbox
def test_a_task_beyond_the_memory_limit_is_killed_and_the_sandbox_says_so(sandbox_factory: SandboxFactory) -> None:
    """cgroup v1 here (memory.limit_in_bytes and memsw): the kernel's OOM killer takes the task that went
    over, the rest of the sandbox lives on, and the sandbox's count of such kills says so."""
    sandbox = sandbox_factory(memory_gb=0.75)
    record = next(r for r in sandbox.limits if r.name == "memory_gb")
    assert record.applied, record
    assert local_sandboxes.oom_kills(sandbox) == 0
    hog = run(sandbox, "python3 -c \"b = b'x' * (1536 * 2**20); print('survived', len(b))\"")
    assert hog["return_code"] in (137, -9) and "survived" not in hog["stdout"], hog
    assert local_sandboxes.oom_kills(sandbox) >= 1
    assert run(sandbox, "echo alive")["stdout"] == "alive\n"


@pytest.mark.sandbox
def test_hints_beyond_the_host_are_recorded_not_fatal(sandbox_factory: SandboxFactory) -> None:
    sandbox = sandbox_factory(wait=False, vcpus=4096)
    record = next(r for r in sandbox.limits if r.name == "vcpus")
    assert not record.applied and "not restricted" in record.detail


@pytest.mark.sandbox
def test_stop_leaves_nothing_behind(desktop_image: ImageInfo) -> None:
    spec = LocalSandboxSpec(sandbox_id="stop-clean", rootfs=str(desktop_image.rootfs), vcpus=1, memory_gb=1.0)
    state = local_runtime.start(spec)
    try:
        wait_for_status(state)
        pids = local_sandboxes.sandbox_pids(state)
        assert len(pids) >= 6  # supervisor, bwrap, init, Xvfb, openbox, server
        assert processes_mentioning(state.sandbox_id)
    finally:
        assert local_runtime.stop(state.sandbox_id) is True
    assert_nothing_left(state, pids)
    assert local_runtime.stop(state.sandbox_id) is False  # idempotent


@pytest.mark.sandbox
def test_a_reset_kills_the_old_sandbox_and_leaves_nothing_of_it(desktop_image: ImageInfo) -> None:
    spec = LocalSandboxSpec(sandbox_id="reset-kills", rootfs=str(desktop_image.rootfs), memory_gb=1.0)
    old = local_runtime.start(spec)
    fresh: LocalSandboxState | None = None
    try:
        wait_for_status(old)
        assert run(old, "echo left-over > /root/mark && echo ok")["stdout"] == "ok\n"
        pids = local_sandboxes.sandbox_pids(old)
        old_token = local_sandboxes.auth_token(old)  # read from the state dir, which the reset makes anew
        fresh = local_runtime.reset(spec.sandbox_id)
        # Killed (no orderly stop): none of its processes lives on, its port and disk are gone.
        alive = [pid for pid in pids if procs.start_time(pid) is not None]
        assert not alive, f"processes of the old sandbox still running: {alive}"
        assert not listening_addresses(old.host_port)
        assert fresh.state_dir == old.state_dir and fresh.host_port != old.host_port
        assert local_sandboxes.auth_token(fresh) != old_token
        assert all(Path(cgroup).exists() for cgroup in fresh.cgroups)
        wait_for_status(fresh)
        assert run(fresh, "cat /root/mark 2>&1 || echo gone")["stdout"].endswith("gone\n")
    finally:
        assert local_runtime.stop(spec.sandbox_id) is True
    assert_nothing_left(fresh or old, pids)


@pytest.mark.sandbox
def test_stop_after_the_supervisor_was_killed(desktop_image: ImageInfo) -> None:
    spec = LocalSandboxSpec(sandbox_id="stop-killed", rootfs=str(desktop_image.rootfs), memory_gb=1.0)
    state = local_runtime.start(spec)
    try:
        wait_for_status(state)
        pids = local_sandboxes.sandbox_pids(state)
        os.kill(state.supervisor_pid, signal.SIGKILL)
        assert procs.wait_gone(state.supervisor_pid, state.supervisor_start_time, 10)
        assert not local_sandboxes.is_alive(state)
        # The state dir is still there, so a garbage collector finds the dead sandbox.
        listed = [s.sandbox_id for s in local_sandboxes.list_sandboxes()]
        assert state.sandbox_id in listed
    finally:
        assert local_runtime.stop(state.sandbox_id) is True
    assert_nothing_left(state, pids)


@pytest.mark.sandbox
def test_stopping_a_dead_sandbox_spares_a_neighbour_that_got_its_namespace_number(
    sandbox_factory: SandboxFactory,
) -> None:
    """The kernel reuses a dead namespace's inode number at once; a state file still names it.

    Seen in a full run: gc (or a test) stopping a crashed sandbox killed a live one whose PID
    namespace had been given the dead one's number. Simulated here by writing the live sandbox's
    namespace into the dead one's state.
    """
    live = sandbox_factory()
    dead = sandbox_factory()
    os.kill(dead.supervisor_pid, signal.SIGKILL)  # takes its sandbox along
    assert dead.init_pid is not None and procs.wait_gone(dead.init_pid, dead.init_start_time, 10)
    state_file = Path(dead.state_dir) / local_sandboxes.STATE_FILE
    recorded = json.loads(state_file.read_text())
    recorded["pid_namespace"] = live.pid_namespace
    state_file.write_text(json.dumps(recorded))
    assert local_runtime.stop(dead.sandbox_id, home=sandbox_home(dead)) is True
    assert run(live, "echo still-here")["stdout"] == "still-here\n"


@pytest.mark.sandbox
def test_sandbox_dies_with_its_supervisor(desktop_image: ImageInfo) -> None:
    """SIGKILL of the supervisor takes the sandbox along (PR_SET_PDEATHSIG chain) before any stop()."""
    spec = LocalSandboxSpec(sandbox_id="die-along", rootfs=str(desktop_image.rootfs))
    state = local_runtime.start(spec)
    try:
        wait_for_status(state)
        assert state.init_pid is not None
        init_start = procs.start_time(state.init_pid)
        os.kill(state.supervisor_pid, signal.SIGKILL)
        assert procs.wait_gone(state.init_pid, init_start, 10)
    finally:
        local_runtime.stop(state.sandbox_id)


@pytest.mark.sandbox
def test_duplicate_id_is_refused(local_sandbox: LocalSandboxState, desktop_image: ImageInfo) -> None:
    spec = LocalSandboxSpec(sandbox_id=local_sandbox.sandbox_id, rootfs=str(desktop_image.rootfs))
    with pytest.raises(SandboxError, match="already exists"):
        local_runtime.start(spec, home=sandbox_home(local_sandbox))
    assert local_sandboxes.is_alive(local_sandbox)


@pytest.mark.sandbox
def test_a_failing_start_cleans_up(desktop_image: ImageInfo) -> None:
    """An init that fails at once (sh given ale-init's options): the sandbox exits, its log survives it."""
    spec = LocalSandboxSpec(sandbox_id="bad-init", rootfs=str(desktop_image.rootfs), init="/bin/sh")
    state = local_runtime.start(spec)  # start() does not wait for the server: the init fails later
    try:
        supervisor_start = state.supervisor_start_time
        assert procs.wait_gone(state.supervisor_pid, supervisor_start, 20)
        reloaded = local_sandboxes.load_state("bad-init")
        assert reloaded is not None and reloaded.phase == "exited"
        assert reloaded.exit_code not in (None, 0)
        # The sandbox's file system is gone; the tail of its init's log was kept on the way out.
        assert "Illegal option" in (Path(state.state_dir) / "logs" / "init.log").read_text()
    finally:
        local_runtime.stop("bad-init")
    assert not Path(state.state_dir).exists()
    assert not mounts_mentioning(state.state_dir)
