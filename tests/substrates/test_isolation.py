"""Inside-out isolation suite: a real sandbox probed from the inside, as a hostile agent would.

Every probe goes through the computer-server's ``run_command`` (what an agent has), and every
finding of the isolation review is a test here: host kernel settings, user namespaces, the seccomp
filter, capabilities, planted setuid files, the network, the endpoint's authentication, limits on
tasks, CPU and disk, and the host reading files the sandbox wrote.

The suite is written against :class:`SandboxUnderTest`, so that every substrate runs it: the
``local`` one is below; docker and qemu units add theirs to ``SUBSTRATES``.

Network probes never leave this machine: connections go to the host's loopback, or to addresses
for which the sandbox has no route, so they fail before any packet is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import secrets
import shlex
import socket
import stat
import subprocess
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from ale_iac.contract import UnitSpec
from ale_iac.images import ImageInfo
from ale_iac.profile import Profile
from ale_iac.substrates import isolation, registry
from ale_iac.substrates.authproxy import MODEL_PORT
from ale_iac.substrates.channel import ModelChannel
from ale_iac.substrates.docker.isolation import NOT_APPLICABLE as DOCKER_NOT_APPLICABLE
from ale_iac.substrates.isolation import IsolationProbe
from ale_iac.substrates.local import host as local_host
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.substrates.local.isolation import NOT_APPLICABLE as LOCAL_NOT_APPLICABLE
from ale_iac.substrates.local.isolation import LocalIsolation
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec, LocalSandboxState
from ale_iac.substrates.qemu.isolation import NOT_APPLICABLE as QEMU_NOT_APPLICABLE
from ale_iac.substrates.relay import unix_connector
from ale_iac.substrates.seccomp import SANDBOX_POLICY
from tests.support.channel import answering_socket
from tests.support.kube import POD_NOT_APPLICABLE, KubeCluster, KubePodIsolation, kube_profile, objects_of
from tests.support.rootless import HostUser, user_command
from tests.support.sandbox import Endpoint, new_sandbox_id, run, wait_for_status
from tests.support.seccomp import PROBE_SCRIPT, PROBES, nr

pytestmark = pytest.mark.sandbox
F = TypeVar("F", bound=Callable[..., Any])
LOCAL_KINDS = [
    "local",
    pytest.param("local-rootless", marks=pytest.mark.rootless),
    pytest.param("local-checkpoint", marks=pytest.mark.criu),
    pytest.param("local-template", marks=pytest.mark.criu),
]
"""The local substrate as root, as a normal user (``rootless``: a user the session makes), a checkpointed
unit after a reset (its processes a CRIU restore of the checkpoint, not a boot), and an ephemeral unit restored
from a template slot's checkpoint, which another unit made."""

PIDS_LIMIT = 200
DISK_GB = 1
# CAP_CHOWN, DAC_OVERRIDE, FOWNER, KILL, SETGID, SETUID, NET_BIND_SERVICE, SYS_CHROOT
SANDBOX_CAPS_MASK = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 10) | (1 << 18)
CAP_FSETID, CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_ADMIN, CAP_AUDIT_WRITE, CAP_SETFCAP = 4, 12, 13, 21, 29, 31


@dataclass
class SandboxUnderTest:
    """A running unit: its endpoint (what an agent has) and its substrate's probe (the host's side)."""

    kind: str
    probe: IsolationProbe
    endpoint: Endpoint
    owner: int = 0
    """The host user that started it (its state folders are that user's)."""
    pids_limit: int = PIDS_LIMIT
    """Its task limit (a pod's is the cluster's ``podPidsLimit``)."""
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    """What its handle records (a pod's seccomp profile, its network policy)."""


def checks(check: str) -> Callable[[F], F]:
    """The isolation check a test runs: it is collected for each substrate whose probe says the check applies
    (``pytest_generate_tests``); on the others it is no test at all, and the probe's reason is in
    ``docs/isolation.md`` (a skip would run nothing and look like coverage)."""

    def mark(fn: F) -> F:
        fn.isolation_check = check  # type: ignore[attr-defined]
        return fn

    return mark


def applies(sut: SandboxUnderTest, check: str) -> None:
    """The running unit's probe agrees that the check applies (what collection decided from its reasons)."""
    assert sut.probe.not_applicable(check) is None, (sut.kind, check)


DOCKER = pytest.param("docker", marks=pytest.mark.docker)
QEMU = pytest.param("qemu", marks=[pytest.mark.qemu, pytest.mark.timeout(900)])
"""A first qemu unit may make the saved memory state: a cold boot under TCG, minutes on a loaded host."""
KUBERNETES = pytest.param(
    "kubernetes",
    marks=[
        pytest.mark.kubernetes,
        pytest.mark.engine,
        pytest.mark.xdist_group("kubernetes"),  # the worker that owns the test cluster
        pytest.mark.timeout(3900),  # a cold cache builds the cluster first
    ],
)
"""A pod of the ``kubernetes`` profile on the private test cluster, whose node is this host."""


REASONS = {
    "local": LOCAL_NOT_APPLICABLE,
    "local-rootless": LOCAL_NOT_APPLICABLE,
    "local-checkpoint": LOCAL_NOT_APPLICABLE,
    "local-template": LOCAL_NOT_APPLICABLE,
    "docker": DOCKER_NOT_APPLICABLE,
    "qemu": QEMU_NOT_APPLICABLE,
    "kubernetes": POD_NOT_APPLICABLE,
}
"""Each substrate's reasons why a check does not apply (its probe's ``not_applicable``), by check."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    check = getattr(metafunc.function, "isolation_check", None)
    if "sut" not in metafunc.fixturenames or check is None:
        return
    kinds = [kind for kind in [*LOCAL_KINDS, DOCKER, QEMU, KUBERNETES] if check not in REASONS[_kind_of(kind)]]
    metafunc.parametrize("sut", kinds, indirect=True, scope="module")


def _kind_of(param: Any) -> str:
    return param if isinstance(param, str) else str(param.values[0])


@pytest.fixture(scope="module")
def sut(request: pytest.FixtureRequest, desktop_image: ImageInfo) -> Iterator[SandboxUnderTest]:
    if request.param == "kubernetes":
        yield from _kubernetes_sut(request.getfixturevalue("kube_cluster"), request)
        return
    if request.param == "qemu":
        yield from _qemu_sut(desktop_image)
        return
    if request.param == "docker":
        yield from _docker_sut(request.getfixturevalue("docker_image"))
        return
    if request.param == "local-rootless":
        yield from _rootless_sut(request.getfixturevalue("rootless_user"))
        return
    restored = request.param == "local-checkpoint"
    template = request.param == "local-template"
    spec = LocalSandboxSpec(
        sandbox_id=new_sandbox_id("isolation"),
        rootfs=str(desktop_image.rootfs),
        pids_limit=PIDS_LIMIT,
        disk_gb=DISK_GB,
        checkpoint=restored or template,
        template=template,
    )
    if template:  # a unit that makes the template (or finds it made), then the unit under test, restored from it
        local_runtime.stop(local_runtime.start(spec).sandbox_id)
        spec = dataclasses.replace(spec, sandbox_id=new_sandbox_id("isolation"))
    state = local_runtime.start(spec)
    try:
        if restored:
            state = local_runtime.reset(spec.sandbox_id)
            assert state.restored
        wait_for_status(state)
        if template:  # start() returned while the supervisor restored it: its processes are in the state since
            reread = local_sandboxes.load_state(spec.sandbox_id)
            assert reread is not None and reread.restored, reread
            state = reread
        yield SandboxUnderTest(request.param, registry.get("local").isolation_probe(state), Endpoint.of(state))
    finally:
        local_runtime.stop(state.sandbox_id)


def _rootless_sut(user: HostUser) -> Iterator[SandboxUnderTest]:
    """A local sandbox started by a normal user (``rootless`` mode), probed from here (root) like the others."""
    sandbox_id = new_sandbox_id("isolation")
    started = user.python(
        "import json\n"
        "from ale_iac.images import require_image\n"
        "from ale_iac.substrates.local import runtime, sandboxes\n"
        f"spec = sandboxes.LocalSandboxSpec(sandbox_id={sandbox_id!r}, rootfs=str(require_image('desktop').rootfs), "
        f"pids_limit={PIDS_LIMIT}, disk_gb={DISK_GB})\n"
        "print(json.dumps(runtime.start(spec).to_json()))\n"
    )
    state = LocalSandboxState.from_json(json.loads(started.splitlines()[-1]))
    try:
        assert state.mode == local_host.MODE_ROOTLESS, state
        wait_for_status(state)
        yield SandboxUnderTest(
            "local-rootless", registry.get("local").isolation_probe(state, user.uid), Endpoint.of(state), user.uid
        )
    finally:
        user.python(f"from ale_iac.substrates.local import runtime; runtime.stop({sandbox_id!r})")


def _docker_sut(image: str) -> Iterator[SandboxUnderTest]:
    from ale_iac.substrates.docker import runtime as docker_runtime

    spec = docker_runtime.DockerSandboxSpec(
        sandbox_id=new_sandbox_id("isolation"), image=image, pids_limit=PIDS_LIMIT, disk_gb=DISK_GB
    )
    state = docker_runtime.start(spec)
    try:
        endpoint = Endpoint(state.endpoint, state.token)
        wait_for_status(endpoint)
        yield SandboxUnderTest("docker", registry.get("docker").isolation_probe(state), endpoint)
    finally:
        docker_runtime.stop(state.sandbox_id)


def _qemu_sut(desktop_image: ImageInfo) -> Iterator[SandboxUnderTest]:
    from ale_iac.substrates.qemu import runtime as qemu_runtime
    from ale_iac.substrates.qemu.disk import ensure_export as ensure_qcow2_image

    disk = ensure_qcow2_image(desktop_image.name)
    spec = qemu_runtime.QemuSandboxSpec(
        sandbox_id=new_sandbox_id("isolation"), disk=disk.disk, kernel=disk.kernel, initrd=disk.initrd
    )
    state = qemu_runtime.start(spec)
    try:
        endpoint = Endpoint(state.endpoint, state.token)
        wait_for_status(endpoint)
        yield SandboxUnderTest("qemu", registry.get("qemu").isolation_probe(state), endpoint)
    finally:
        qemu_runtime.stop(state.sandbox_id)


def _kubernetes_sut(cluster: KubeCluster, request: pytest.FixtureRequest) -> Iterator[SandboxUnderTest]:
    """One unit of the shipped ``kubernetes`` profile, brought up by the real engine in an ale-iac home of its own
    (the per-test home of ``tests/conftest.py`` comes and goes under a module-scoped unit)."""
    home = request.getfixturevalue("tmp_path_factory").mktemp("kube-isolation-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ALE_IAC_HOME", str(home))
        yield from _pod_under_test(cluster, kube_profile(cluster), "kube-isolation", home)


def _pod_under_test(
    cluster: KubeCluster, profile: Profile, name: str, home: Path | None = None
) -> Iterator[SandboxUnderTest]:
    """A unit of ``profile`` on the test cluster as the suite sees it, destroyed afterwards, leaving nothing."""
    from ale_iac.engine import Engine
    from ale_iac.provision import destroy_stack, new_stack_name, up_unit

    engine = Engine(home=home)
    stack = new_stack_name("run", name)
    handle = up_unit(engine, profile, stack, UnitSpec(name="u0"))
    try:
        endpoint = Endpoint(handle.endpoint, handle.token())
        wait_for_status(endpoint)
        namespace, pod = handle.resource_id.split("/")
        probe = KubePodIsolation(cluster, namespace, pod)
        yield SandboxUnderTest("kubernetes", probe, endpoint, pids_limit=probe.tasks_limit(), labels=handle.labels)
    finally:
        destroy_stack(engine, stack)
        assert objects_of(cluster, stack) == []


def sh(sut: SandboxUnderTest, command: str) -> dict[str, Any]:
    return run(sut.endpoint, command)


def python(sut: SandboxUnderTest, code: str) -> dict[str, Any]:
    return sh(sut, "python3 -c " + shlex.quote(textwrap.dedent(code)))


def status_field(text: str, name: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(name + ":"))


# --- who root inside is --------------------------------------------------------------------------------


@checks(isolation.ROOT_UNPRIVILEGED)
def test_root_inside_is_an_unprivileged_user_on_the_host(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.ROOT_UNPRIVILEGED)
    check_root_is_unprivileged(sut)


def _local_host_ids(sut: SandboxUnderTest, uid_map: list[str]) -> set[int]:
    assert isinstance(sut.probe, LocalIsolation)
    base = int(uid_map[1])
    if sut.probe.state.mode == local_host.MODE_ROOTLESS:
        # The user's own uid is root inside, and nothing else of the host but, with newuidmap, the
        # user's subordinate range (/etc/subuid) for ids 1..65535.
        assert uid_map[:3] == ["0", str(sut.owner), "1"] and sut.owner not in (0, base + 1), (uid_map, sut.owner)
        assert base == sut.probe.state.uid_base
        host_ids = {sut.owner}
        if len(uid_map) > 3:
            assert uid_map[3] == "1" and uid_map[5] == "65535" and int(uid_map[4]) >= 65536, uid_map
            host_ids |= set(range(int(uid_map[4]), int(uid_map[4]) + 65535))
        return host_ids
    assert uid_map[0::3] == ["0"] and uid_map[2::3] == ["65536"], uid_map
    assert base >= 2**30, uid_map
    return set(range(base, base + 65536))


def check_root_is_unprivileged(sut: SandboxUnderTest) -> None:
    """Root inside is a host uid of an unprivileged range, and every process of the unit runs as one of it."""
    uid_map = sh(sut, "cat /proc/self/uid_map")["stdout"].split()
    assert sh(sut, "cat /proc/self/gid_map")["stdout"].split()[0::3] == uid_map[0::3]
    if isinstance(sut.probe, LocalIsolation):
        host_ids = _local_host_ids(sut, uid_map)
    else:  # one range, root inside its first id: no id of a real user (below 65536), never the whole id space
        assert len(uid_map) == 3 and uid_map[0] == "0", uid_map
        base, count = int(uid_map[1]), int(uid_map[2])
        assert base >= 65536 and count <= 65536, uid_map
        host_ids = set(range(base, base + count))
    assert sh(sut, "id -u")["stdout"] == "0\n"
    inside = [pid for pid in sut.probe.host_pids() if Path(f"/proc/{pid}/ns/user").exists()]
    own_userns = os.readlink("/proc/self/ns/user")
    sandboxed = [pid for pid in inside if os.readlink(f"/proc/{pid}/ns/user") != own_userns]
    assert sandboxed, "no process of the sandbox runs in a user namespace of its own"
    for pid in sandboxed:
        uids = status_field(Path(f"/proc/{pid}/status").read_text(), "Uid").split()
        assert {int(u) for u in uids} <= host_ids, (pid, uids)


@checks(isolation.KERNEL_SETTINGS)
def test_host_kernel_settings_are_read_only(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.KERNEL_SETTINGS)
    # A no-op write of a host-global setting: the value read is written back.
    noop = sh(sut, 'v=$(cat /proc/sys/kernel/core_pattern); printf %s "$v" > /proc/sys/kernel/core_pattern')
    assert noop["return_code"] != 0, noop
    writable = python(
        sut,
        """
        import os
        found = []
        for folder, _, files in os.walk("/proc/sys"):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    os.close(os.open(path, os.O_WRONLY))  # opening writes nothing
                    found.append(path)
                except OSError:
                    pass
        print(len(found), *found[:20])
        """,
    )
    assert writable["stdout"].split()[0] == "0", writable["stdout"]
    for path in ("/proc/sysrq-trigger", "/proc/sys/vm/drop_caches"):
        assert sh(sut, f"test -w {path}")["return_code"] != 0, path


@checks(isolation.NO_USERNS_INSIDE)
def test_no_user_namespace_can_be_made_inside(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.NO_USERNS_INSIDE)
    reply = sh(sut, "unshare --user --map-root-user true")
    assert reply["return_code"] != 0 and "Operation not permitted" in reply["stderr"], reply
    # Nor through another path to the same kernel call: clone(CLONE_NEWUSER) from Python.
    child = python(
        sut,
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
        if pid == 0:
            os._exit(0)
        print(pid, ctypes.get_errno())
        """,
    )
    assert child["stdout"].split() == ["-1", "1"], child  # EPERM


@checks(isolation.NO_NAMESPACE_DESCRIPTOR)
def test_no_process_inside_holds_a_namespace_descriptor(sut: SandboxUnderTest) -> None:
    """Nothing the host used to build the unit is left open in it: a descriptor of a namespace (its user
    namespace, say) handed down through the sandbox's start would outlive that start, and a process inside
    could join what it names (``setns``) wherever its filter allows."""
    applies(sut, isolation.NO_NAMESPACE_DESCRIPTOR)
    held = python(
        sut,
        """
        import os
        found, processes = [], 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue  # it exited
            processes += 1
            for fd in fds:
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.split(":", 1)[0] in ("user", "net", "mnt", "pid", "uts", "ipc", "cgroup", "time"):
                    found.append(f"{pid}:{fd}->{target}")
        print(processes, *found)
        """,
    )
    assert held["return_code"] == 0, held
    processes, *found = held["stdout"].split()
    assert int(processes) >= 2 and found == [], held["stdout"]  # its init and this probe at least


@checks(isolation.SECCOMP)
def test_the_seccomp_filter_is_loaded_and_every_family_denied(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.SECCOMP)
    check_seccomp_families(sut)


def check_seccomp_families(sut: SandboxUnderTest) -> None:
    """ale-iac's filter is loaded: one call per family of its policy gets exactly the family's errno."""
    status = sh(sut, "cat /proc/self/status")["stdout"]
    assert status_field(status, "Seccomp") == "2" and status_field(status, "NoNewPrivs") == "1", status
    for family_name, (syscall, args) in sorted(PROBES.items()):
        number = nr(syscall)
        if number < 0:
            continue
        payload = json.dumps([number, list(args), None])
        reply = sh(sut, f"python3 -c {shlex.quote(PROBE_SCRIPT)} {shlex.quote(payload)}")
        assert reply["return_code"] == 0, reply
        result = json.loads(reply["stdout"])
        assert result == {"result": -1, "errno": SANDBOX_POLICY.family(family_name).errno}, (family_name, result)


@checks(isolation.CAPABILITIES)
def test_capabilities_and_bounding_set_are_cut(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.CAPABILITIES)
    status = sh(sut, "cat /proc/1/status /proc/self/status")["stdout"]
    for field in ("CapEff", "CapPrm", "CapBnd"):
        values = [line.split()[1] for line in status.splitlines() if line.startswith(field + ":")]
        assert values and all(int(v, 16) == SANDBOX_CAPS_MASK for v in values), (field, values)
    for field in ("CapInh", "CapAmb"):
        values = [line.split()[1] for line in status.splitlines() if line.startswith(field + ":")]
        assert all(int(v, 16) == 0 for v in values), (field, values)
    for cap in (CAP_FSETID, CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_ADMIN, CAP_AUDIT_WRITE, CAP_SETFCAP):
        assert not SANDBOX_CAPS_MASK & (1 << cap)


# --- files ---------------------------------------------------------------------------------------------


@checks(isolation.SETUID_FILES)
def test_planted_setuid_files_never_reach_the_host(sut: SandboxUnderTest) -> None:
    """A setuid file planted inside raises no one inside, and the host keeps none it could run: the host's
    folders of the unit are private, and a file of the unit's own disk (a mount in them, on docker) is on a
    nosuid mount."""
    applies(sut, isolation.SETUID_FILES)
    plant = sh(
        sut,
        "cp /bin/sh /root/suid-sh && chmod 4755 /root/suid-sh && "
        "cp /bin/sh /var/log/ale/suid-sh && chmod 4755 /var/log/ale/suid-sh && stat -c %a /root/suid-sh",
    )
    assert plant["return_code"] == 0 and plant["stdout"] == "4755\n", plant
    # Not even inside does it raise anyone: nosuid mounts and no_new_privs (and uid 1000 exists inside).
    if sh(sut, "awk '$1 <= 1000 && 1000 < $1 + $3' /proc/self/uid_map")["stdout"]:  # rootless w/o newuidmap: none
        raised = sh(sut, "setpriv --reuid=1000 --regid=1000 --clear-groups /root/suid-sh -c 'id -u'")
        assert raised["stdout"] == "1000\n", raised
    for root in sut.probe.host_paths():
        if sut.kind == "kubernetes":
            _check_kubelet_folder(root, planted=["volumes/kubernetes.io~empty-dir/home/suid-sh"])
        else:
            _check_host_folder(root, sut.owner)
    # The sandbox's own file system is mounted in no host mount namespace but its own.
    sandbox_pids = set(sut.probe.host_pids())
    own = os.readlink("/proc/self/ns/mnt")
    for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) not in sandbox_pids):
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") != own:
                continue
            assert "suid-sh" not in Path(f"/proc/{pid}/mountinfo").read_text()
        except OSError:
            continue


def _check_host_folder(root: Path, owner: int) -> None:
    """The host's folder of a unit: the owner's, 0700, files 0600, no setuid file; a file system mounted in
    it (the unit's own disk) holds the unit's files, and must be nosuid."""
    for folder, dirs, files in os.walk(root):
        info = os.stat(folder)
        assert info.st_uid == owner and stat.S_IMODE(info.st_mode) & 0o077 == 0, (folder, oct(info.st_mode))
        for mount in [name for name in dirs if os.path.ismount(os.path.join(folder, name))]:
            dirs.remove(mount)
            assert os.statvfs(os.path.join(folder, mount)).f_flag & os.ST_NOSUID, os.path.join(folder, mount)
        for name in files + dirs:
            entry = os.lstat(os.path.join(folder, name))
            assert not entry.st_mode & (stat.S_ISUID | stat.S_ISGID), os.path.join(folder, name)
            if stat.S_ISREG(entry.st_mode):
                assert stat.S_IMODE(entry.st_mode) & 0o077 == 0, (name, oct(entry.st_mode))


def _check_kubelet_folder(root: Path, planted: list[str]) -> None:
    """The kubelet's folder of a pod, whose modes are the kubelet's (emptyDirs 0777, for any uid in the pod):
    no host user but root reaches it (a folder above it is root's, 0700), and it is on a ``nosuid`` mount, so a
    setuid file planted there (``planted``, relative to it: it is there, setuid root) raises no one on the
    host."""
    above = [folder for folder in root.parents if folder != Path("/")]
    private = [f for f in above if (i := os.stat(f)).st_uid == 0 and stat.S_IMODE(i.st_mode) & 0o077 == 0]
    assert private, f"every folder above {root} is open to other host users"
    assert os.statvfs(root).f_flag & os.ST_NOSUID, f"{root} is on a mount without nosuid"
    for name in planted:
        info = os.lstat(root / name)
        assert info.st_uid == 0 and info.st_mode & stat.S_ISUID, (name, oct(info.st_mode))


@checks(isolation.NO_HOST_PATH)
def test_no_host_path_is_visible_inside(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.NO_HOST_PATH)
    mountinfo = sh(sut, "cat /proc/self/mountinfo")["stdout"]
    for root in sut.probe.host_paths():
        assert str(root) not in mountinfo
    # The home as a path of its own (a field, or a value in an overlay's options), not as the tail of another
    # path's component: containerd's state folder is named `root` too (.../containerd/root/...).
    assert not re.search(rf"(^|[\s=,:]){re.escape(str(Path.home()))}/", mountinfo, re.MULTILINE), mountinfo
    assert ".cache/ale-iac" not in mountinfo


@checks(isolation.NO_HOST_FILE_WRITABLE)
def test_no_host_file_is_writable_inside(sut: SandboxUnderTest) -> None:
    """Every mount inside is the sandbox's own (its overlay, its layer, tmpfs, its proc), but for the few
    device nodes bound from the host's /dev (and, on docker, /dev/null over masked /proc files, the engine's
    read-only /etc/hosts and friends, sysfs and the unit's cgroup); nothing on any other mount is writable."""
    applies(sut, isolation.NO_HOST_FILE_WRITABLE)
    probe = python(
        sut,
        """
        import json, os, stat
        OWN = {"overlay", "tmpfs", "proc", "devpts", "mqueue"}
        DEVICES = {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}
        foreign, writable, own = [], [], set()
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            dash = fields.index("-")
            point, fstype, source = fields[4], fields[dash + 1], fields[dash + 2]
            # A file system of the unit's own: root mode's layer, a docker unit's volumes; a pod's volumes (binds of its
            # folder in the kubelet's file system).
            if fstype in OWN or (fstype == "ext4" and source.startswith("/dev/loop")):
                own.add(point)
                continue
            foreign.append([point, fstype])
        for point, _ in foreign:
            paths = [point] if not os.path.isdir(point) else [
                os.path.join(folder, name) for folder, dirs, files in os.walk(point) for name in dirs + files
            ] + [point]
            for path in paths:
                try:
                    mode = os.lstat(path).st_mode
                except OSError:
                    continue
                null = stat.S_ISCHR(mode) and os.lstat(path).st_rdev == os.makedev(1, 3)
                if stat.S_ISLNK(mode) or (stat.S_ISCHR(mode) and path in DEVICES) or null or path in own:
                    continue
                if os.access(path, os.W_OK):
                    writable.append(path)
        print(json.dumps({"foreign": foreign, "writable": writable[:20]}))
        """,
    )
    found = json.loads(probe["stdout"])
    assert found["writable"] == [], found
    if sut.kind in ("docker", "kubernetes"):  # the engine's sysfs and cgroups, read-only
        return
    assert {point for point, _ in found["foreign"]} <= {
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
        "/proc/sys",
    }, found


@checks(isolation.WRITABLE_NOSUID)
def test_every_writable_mount_is_nosuid_and_nodev(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.WRITABLE_NOSUID)
    check_writable_mounts_nosuid(sut)


def check_writable_mounts_nosuid(sut: SandboxUnderTest) -> None:
    """Every mount the unit can write is nosuid, and nodev but for those that hold the device nodes
    themselves (/dev, devpts); a device node bound over a path (/dev/null over a masked /proc file) is not a
    place to plant a file."""
    probe = python(
        sut,
        """
        import json, os, stat
        found = []
        for line in open("/proc/self/mountinfo"):
            fields = line.split()
            dash = fields.index("-")
            point, options, fstype = fields[4], fields[5].split(","), fields[dash + 1]
            if "rw" not in options or stat.S_ISCHR(os.lstat(point).st_mode):
                continue
            needs = {"nosuid"} | (set() if point == "/dev" or fstype == "devpts" else {"nodev"})
            if not needs <= set(options):
                found.append([point, fstype, fields[5]])
        print(json.dumps(found))
        """,
    )
    assert probe["return_code"] == 0 and json.loads(probe["stdout"]) == [], probe


@checks(isolation.DISK_BOUNDED)
def test_the_disk_is_bounded(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.DISK_BOUNDED)
    check_disk_bounded(sut)


def check_disk_bounded(sut: SandboxUnderTest) -> None:
    """The unit's home and its logs fill their own bounded file systems (``DISK_GB``), not the host's."""
    for target in ("/root/big", "/var/log/ale/big"):
        grow = sh(sut, f"fallocate -l {DISK_GB + 1}G {target}; echo rc=$?; rm -f {target}")
        assert "rc=0" not in grow["stdout"], grow
        assert "No space left on device" in grow["stderr"], grow


@checks(isolation.HOST_READS_SAFELY)
def test_the_host_reads_sandbox_files_without_following_links_or_blocking(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.HOST_READS_SAFELY)
    plant = sh(
        sut,
        "cd /var/log/ale && rm -f server.log xvfb.log && ln -s /etc/shadow server.log && mkfifo xvfb.log",
    )
    assert plant["return_code"] == 0, plant
    results: dict[str, str] = {}

    def read_both() -> None:
        results["server.log"] = sut.probe.read_log("server.log")
        results["xvfb.log"] = sut.probe.read_log("xvfb.log")

    reader = threading.Thread(target=read_both, daemon=True)
    reader.start()
    reader.join(20)
    assert not reader.is_alive(), "reading a sandbox-written FIFO blocked the host"
    assert results == {"server.log": "", "xvfb.log": ""}, results


# --- network and endpoint ------------------------------------------------------------------------------


@checks(isolation.NETWORK_LOOPBACK_ONLY)
def test_no_network_but_loopback_and_no_host_helper(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.NETWORK_LOOPBACK_ONLY)
    links = sh(sut, "ip -o link")["stdout"].splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"], links
    names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid in sut.probe.host_pids()}
    assert not names & {"slirp4netns", "pasta", "vpnkit"}, names
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.setblocking(False)
        port = server.getsockname()[1]
        probes = python(
            sut,
            f"""
            import socket
            for host, port, kind in [("10.0.2.2", {port}, "tcp"), ("10.0.2.3", 53, "tcp"), ("10.0.2.3", 53, "udp"),
                                     ("10.0.2.255", 9, "udp"), ("127.0.0.1", {port}, "tcp")]:
                try:
                    if kind == "tcp":
                        socket.create_connection((host, port), timeout=3).close()
                    else:
                        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", (host, port))
                    print(host, port, kind, "reached")
                except OSError as exc:
                    print(host, port, kind, "failed", exc.errno)
            """,
        )
        with pytest.raises(BlockingIOError):
            server.accept()
    lines = probes["stdout"].splitlines()
    assert len(lines) == 5 and all(" failed " in line for line in lines), lines


@checks(isolation.GATEWAY_CHANNEL)
def test_the_model_channel_leads_only_to_what_the_host_carries_it_to(sut: SandboxUnderTest, tmp_path: Path) -> None:
    """127.0.0.1:<model port> inside reaches, over a connection the host opened to the endpoint (with its
    token), only what the host joins it to: here a Unix socket of the test's own, which sees the bytes whole."""
    applies(sut, isolation.GATEWAY_CHANNEL)
    # A half-close (shutdown of one direction) does not cross a Kubernetes port-forward (containerd's copy ends
    # the whole stream), so a pod's request is answered on its length, as a model's HTTP exchange is.
    half_close = sut.kind != "kubernetes"
    probe = f"""
        import socket
        try:
            with socket.create_connection(("127.0.0.1", {MODEL_PORT}), timeout=20) as c:
                c.sendall(b"ping-from-the-sandbox")
                if {half_close}:
                    c.shutdown(socket.SHUT_WR)
                print("got", c.recv(100).decode() or "EOF")
        except OSError as exc:
            print("failed", exc.errno)
        """
    path = tmp_path / "model.sock"
    length = None if half_close else len(b"ping-from-the-sandbox")
    with answering_socket(path, b"pong-from-the-host", length=length) as received:

        async def carried() -> dict[str, Any]:
            channel = ModelChannel(sut.endpoint.url, sut.endpoint.token or "", unix_connector(str(path)), pool=1)
            await channel.open()
            try:
                return await asyncio.to_thread(python, sut, probe)
            finally:
                await channel.aclose()

        assert asyncio.run(carried())["stdout"].strip() == "got pong-from-the-host"
    assert received == [b"ping-from-the-sandbox"]


@checks(isolation.ENDPOINT_TOKEN)
def test_the_endpoint_requires_the_token_and_keeps_it_out(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.ENDPOINT_TOKEN)
    url = sut.endpoint.url
    assert httpx.get(f"{url}/status", timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer " + secrets.token_urlsafe(32)}
    assert httpx.post(f"{url}/cmd", json={"command": "version"}, headers=wrong, timeout=10).status_code == 401
    assert httpx.get(f"{url}/status", headers=sut.endpoint.headers, timeout=10).status_code == 200
    token = sut.endpoint.token
    assert token
    half = len(token) // 2  # the probe's own command line must not carry the token whole
    search = sh(
        sut,
        f"t={shlex.quote(token[:half])}{shlex.quote(token[half:])}; "
        'grep -rlF -- "$t" /var/log/ale /proc/[0-9]*/environ /root /tmp 2>/dev/null; true',
    )
    assert search["stdout"] == "", search


@checks(isolation.OTHER_USER)
def test_another_user_of_the_host_cannot_drive_the_sandbox(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.OTHER_USER)
    user = f"aleprobe{secrets.token_hex(3)}"
    added = user_command(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user])
    assert added.returncode == 0, added.stderr
    try:
        outcome = _as_host_id(user, user, sut.probe.host_paths(), endpoint=sut.endpoint.url)
        assert outcome.pop("cmd") == 401, outcome
        assert all(value == 13 for value in outcome.values()), outcome  # EACCES on every state folder
    finally:
        user_command(["userdel", user])


# --- limits --------------------------------------------------------------------------------------------


@checks(isolation.TASKS_BOUNDED)
def test_the_number_of_tasks_is_bounded(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.TASKS_BOUNDED)
    reply = python(
        sut,
        f"""
        import subprocess
        children, refused = [], 0
        for _ in range({sut.pids_limit + 200}):
            try:
                children.append(subprocess.Popen(["sleep", "60"]))
            except OSError:
                refused += 1
        print(len(children), refused)
        for child in children:
            child.kill()
            child.wait()
        """,
    )
    started, refused = (int(n) for n in reply["stdout"].split())
    assert started < sut.pids_limit and refused > 0, reply
    assert sut.probe.tasks_in_use() < sut.pids_limit
    # The sandbox still works once the burst is gone.
    assert sh(sut, "echo alive")["stdout"] == "alive\n"


@checks(isolation.CGROUPS_OUT_OF_REACH)
def test_cgroups_and_cpu_placement_are_out_of_reach(sut: SandboxUnderTest) -> None:
    """No limit can be written away from inside. A local unit has no cgroup file system and a cgroup namespace
    of its own; a docker unit has its own cgroup mounted (cgroup v1: no cgroup namespace), but with the user
    namespace every file of it belongs to a host uid it has no capability over; a pod's cgroups are mounted
    read-only by its runtime."""
    applies(sut, isolation.CGROUPS_OUT_OF_REACH)
    mountinfo = sh(sut, "cat /proc/self/mountinfo")["stdout"]
    if sut.kind in ("docker", "kubernetes"):
        writable = python(
            sut,
            """
            import os
            points = [line.split()[4] for line in open("/proc/self/mountinfo") if " - cgroup" in line]
            found = [os.path.join(folder, name) for point in points for folder, dirs, files in os.walk(point)
                     for name in files + dirs if os.access(os.path.join(folder, name), os.W_OK)]
            print(len(points), len(found), *found[:10])
            """,
        )["stdout"].split()
        assert int(writable[0]) > 0 and writable[1:] == ["0"], writable
        return
    assert " cgroup" not in mountinfo, mountinfo  # no cgroupfs to write a limit away
    assert sh(sut, "cat /proc/self/cgroup")["stdout"].strip().endswith(":/")  # its own cgroup namespace


@checks(isolation.HOST_PROCESS_CONFINED)
def test_the_host_process_is_confined(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.HOST_PROCESS_CONFINED)
    check_host_process_seccomp(sut)


def check_host_process_seccomp(sut: SandboxUnderTest) -> None:
    """Where a host process stands for the unit (QEMU), every thread of it runs under a seccomp filter."""
    pids = sut.probe.host_pids()
    assert pids, "no host process of the unit"
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        assert status_field(status, "Seccomp") == "2", (pid, status)
        for task in os.listdir(f"/proc/{pid}/task"):  # every thread: -sandbox filters them all
            assert status_field(Path(f"/proc/{pid}/task/{task}/status").read_text(), "Seccomp") == "2", task


@checks(isolation.HOST_PROCESS_UNPRIVILEGED)
def test_the_host_process_is_unprivileged(sut: SandboxUnderTest) -> None:
    applies(sut, isolation.HOST_PROCESS_UNPRIVILEGED)
    check_host_process_unprivileged(sut)


def check_host_process_unprivileged(sut: SandboxUnderTest) -> None:
    """The host process that stands for the unit (QEMU) is no root: every uid and gid of it non-zero, no
    supplementary root group, no capability (not even in its bounding set), no_new_privs; and its identity
    reads none of the host folders kept for the unit (its record, its token)."""
    pids = sut.probe.host_pids()
    assert pids, "no host process of the unit"
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        uids, gids = status_field(status, "Uid").split(), status_field(status, "Gid").split()
        assert "0" not in uids + gids and len(set(uids)) == len(set(gids)) == 1, (pid, uids, gids)
        assert "0" not in status_field(status, "Groups").split(), (pid, status)
        for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status_field(status, field), 16) == 0, (pid, field, status)
        assert status_field(status, "NoNewPrivs") == "1", (pid, status)
        reached = _as_host_id(int(uids[0]), int(gids[0]), sut.probe.host_paths())
        assert all(value == 13 for value in reached.values()), reached  # EACCES on every one


def _as_host_id(uid: int | str, gid: int | str, paths: list[Path], endpoint: str | None = None) -> dict[str, Any]:
    """What a process of ``uid``/``gid`` (no groups) gets listing each of ``paths``: an errno, or "listed"; and,
    with ``endpoint``, under ``"cmd"``: the HTTP status of an unauthenticated command there, or "answered"."""
    script = textwrap.dedent(
        f"""
        import json, os, urllib.error, urllib.request
        out = {{}}
        endpoint = {endpoint!r}
        if endpoint is not None:
            request = urllib.request.Request(endpoint + "/cmd", method="POST",
                data=json.dumps({{"command": "run_command", "params": {{"command": "id"}}}}).encode(),
                headers={{"Content-Type": "application/json"}})
            try:
                urllib.request.urlopen(request, timeout=10)
                out["cmd"] = "answered"
            except urllib.error.HTTPError as exc:
                out["cmd"] = exc.code
        for path in {[str(p) for p in paths]!r}:
            try:
                os.listdir(path)
                out[path] = "listed"
            except OSError as exc:
                out[path] = exc.errno
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "/usr/bin/python3", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    reached: dict[str, Any] = json.loads(done.stdout)
    assert reached, paths
    return reached


@pytest.mark.qemu
@pytest.mark.timeout(900)
def test_the_host_process_checks_fail_on_a_weakened_qemu_unit(
    desktop_image: ImageInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks of QEMU's identity and of its seccomp filter are not vacuous: on a unit whose launch script
    runs QEMU as root without its filter (the real script with those two lines undone), each of them fails.
    Booted cold (``restore=False``): a saved state is keyed by the script, so a weakened one would make its own."""
    from ale_iac.substrates.qemu import launcher
    from ale_iac.substrates.qemu import runtime as qemu_runtime
    from ale_iac.substrates.qemu.disk import ensure_export

    weak = launcher.LAUNCH_SCRIPT.read_text()
    for strong, weakened in (
        ("    -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny\n", "\n"),
        ('exec setpriv --reuid="$uid" --regid="$uid" "$groups" --inh-caps=-all --bounding-set=-all --no-new-privs \\\n'
         "    -- qemu-system-x86_64", "exec qemu-system-x86_64"),
    ):  # fmt: skip
        assert weak.count(strong) == 1, f"launch.sh changed: update the weakening of {strong!r}"
        weak = weak.replace(strong, weakened)
    (tmp_path / "launch.sh").write_text(weak)
    monkeypatch.setattr(launcher, "LAUNCH_SCRIPT", tmp_path / "launch.sh")
    disk = ensure_export(desktop_image.name)
    spec = qemu_runtime.QemuSandboxSpec(
        sandbox_id=new_sandbox_id("weakened"), disk=disk.disk, kernel=disk.kernel, initrd=disk.initrd, restore=False
    )
    state = qemu_runtime.start(spec)
    try:
        weak_unit = SandboxUnderTest(
            "qemu", registry.get("qemu").isolation_probe(state), Endpoint(state.endpoint, state.token)
        )
        wait_for_status(weak_unit.endpoint)
        with pytest.raises(AssertionError, match=r"\['0', '0', '0', '0'\]"):  # its uids: root's
            check_host_process_unprivileged(weak_unit)
        with pytest.raises(AssertionError, match="assert '0' == '2'"):  # its Seccomp field: no filter
            check_host_process_seccomp(weak_unit)
    finally:
        qemu_runtime.stop(state.sandbox_id)


def test_the_nosuid_check_fails_on_a_weakened_local_unit(desktop_image: ImageInfo) -> None:
    """The check of nosuid on writable mounts is not vacuous. bubblewrap makes every mount of a local sandbox
    nosuid itself (no option leaves it out), so the weakened unit is a real one into whose mount namespace the
    host mounts one writable tmpfs without nosuid: the check fails on it."""
    spec = LocalSandboxSpec(sandbox_id=new_sandbox_id("weakened"), rootfs=str(desktop_image.rootfs), disk_gb=DISK_GB)
    state = local_runtime.start(spec)
    try:
        weak = SandboxUnderTest("local", registry.get("local").isolation_probe(state), Endpoint.of(state))
        wait_for_status(state)
        check_writable_mounts_nosuid(weak)  # as started: every writable mount nosuid
        namespace = sh(weak, "readlink /proc/self/ns/mnt")["stdout"].strip()  # where its commands run
        inside = [pid for pid in weak.probe.host_pids() if os.readlink(f"/proc/{pid}/ns/mnt") == namespace]
        assert inside, namespace
        mounted = subprocess.run(
            ["nsenter", f"--target={inside[0]}", "--mount", "mount", "-t", "tmpfs", "-o", "rw,size=1m", "weak", "/mnt"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert mounted.returncode == 0, mounted.stderr
        with pytest.raises(AssertionError, match="'/mnt', 'tmpfs'"):
            check_writable_mounts_nosuid(weak)
    finally:
        local_runtime.stop(state.sandbox_id)


@pytest.mark.docker
def test_the_added_checks_fail_on_a_weakened_docker_unit(docker_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks of the user namespace, the seccomp families, nosuid mounts and the disk bound are not
    vacuous: on a unit made without those walls (the host's user namespace, the engine's default seccomp
    profile, plain engine volumes on the host's disk), each of them fails."""
    from ale_iac.substrates.docker import runtime as docker_runtime
    from ale_iac.substrates.docker import walls

    def weak_options(_security: walls.EngineSecurity) -> tuple[dict[str, Any], list[tuple[str, bool, str]]]:
        return {"security_opt": ["no-new-privileges:true"], "userns_mode": "host"}, []

    def plain_volumes(
        engine: Any, spec: Any, labels: dict[str, str], _security: Any
    ) -> tuple[dict[str, Any], list[Any]]:
        volumes = {}
        for role, mount in docker_runtime.VOLUMES.items():
            volume = engine.volumes.create(f"{docker_runtime.container_name(spec.sandbox_id)}-{role}", labels=labels)
            volumes[str(volume.name)] = {"bind": mount, "mode": "rw"}
        return volumes, []

    monkeypatch.setattr(walls, "container_options", weak_options)
    monkeypatch.setattr(docker_runtime, "_volumes", plain_volumes)
    spec = docker_runtime.DockerSandboxSpec(
        sandbox_id=new_sandbox_id("weakened"), image=docker_image, pids_limit=PIDS_LIMIT, disk_gb=DISK_GB
    )
    state = docker_runtime.start(spec)
    try:
        weak = SandboxUnderTest(
            "docker", registry.get("docker").isolation_probe(state), Endpoint(state.endpoint, state.token)
        )
        wait_for_status(weak.endpoint)
        for check in (
            check_root_is_unprivileged,
            check_seccomp_families,
            check_writable_mounts_nosuid,
            check_disk_bounded,
        ):
            with pytest.raises(AssertionError):
                check(weak)
    finally:
        docker_runtime.stop(state.sandbox_id)


@pytest.mark.kubernetes
@pytest.mark.engine
@pytest.mark.xdist_group("kubernetes")
@pytest.mark.timeout(3900)
def test_the_added_checks_fail_on_a_weakened_kubernetes_unit(
    kube_cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seccomp and ``nosuid`` checks are not vacuous on a pod: on a unit declared without those walls (the
    runtime's default seccomp profile instead of the project's policy, and ``/run`` a memory-backed emptyDir,
    which the kubelet mounts as a fresh tmpfs without ``nosuid``), each of them fails."""
    from ale_iac.infra import kubernetes as kube_infra

    monkeypatch.setitem(kube_infra.SCRATCH, "run", ("/run", "Memory"))
    profile = kube_profile(kube_cluster)
    profile = profile.model_copy(
        update={
            "snapshots": {n: r.model_copy(update={"seccomp_localhost": None}) for n, r in profile.snapshots.items()}
        }
    )
    for weak in _pod_under_test(kube_cluster, profile, "kube-weakened"):
        assert weak.labels["ale-seccomp"] == "runtimedefault"
        with pytest.raises(AssertionError):
            check_seccomp_families(weak)
        with pytest.raises(AssertionError, match="'/run', 'tmpfs'"):
            check_writable_mounts_nosuid(weak)
