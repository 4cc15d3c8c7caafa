"""The Linux calls a local sandbox is built from, that Python 3.11's ``os`` does not offer.

Namespaces (``unshare``, ``setns``, a user namespace with a given id mapping), mounts (``mount``,
and the new mount API for an id-mapped bind: ``open_tree``, ``mount_setattr``, ``move_mount``)
Standard library (ctypes) only.

Syscall numbers are those of x86_64 and aarch64 alike for the new mount API (added after the
architectures' tables were unified); ``unshare``/``setns``/``mount`` go through libc.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from collections.abc import Callable
from typing import Final

CLONE_NEWNS: Final = 0x00020000
CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWNET: Final = 0x40000000
CLONE_NEWUTS: Final = 0x04000000

MNT_DETACH: Final = 0x2

MS_RDONLY: Final = 0x1
MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MS_NOEXEC: Final = 0x8
MS_REMOUNT: Final = 0x20
MS_BIND: Final = 0x1000
MS_REC: Final = 0x4000
MS_PRIVATE: Final = 1 << 18

_SYS_OPEN_TREE: Final = 428
_SYS_MOVE_MOUNT: Final = 429
_SYS_MOUNT_SETATTR: Final = 442
_AT_FDCWD: Final = -100
_AT_EMPTY_PATH: Final = 0x1000
_OPEN_TREE_CLONE: Final = 0x1
_OPEN_TREE_CLOEXEC: Final = os.O_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH: Final = 0x4
_MOUNT_ATTR_RDONLY: Final = 0x1
_MOUNT_ATTR_NOSUID: Final = 0x2
_MOUNT_ATTR_NODEV: Final = 0x4
_MOUNT_ATTR_IDMAP: Final = 0x100000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MountAttr(ctypes.Structure):
    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data is not None else None,
        ),
        f"mount {target}",
    )


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def private_mount_namespace() -> None:
    """Move the calling (single-threaded) process into a mount namespace of its own, where no mount
    made later propagates back to the host."""
    unshare(CLONE_NEWNS)
    mount("none", "/", None, MS_REC | MS_PRIVATE)


def idmapped_bind(source: str, target: str, userns_fd: int) -> None:
    """Bind ``source`` read-only, nosuid and nodev at ``target``, its owners seen through ``userns_fd``.

    A file owned by uid 0 on disk then belongs to the user namespace's root (the uid mapped to 0),
    so one image tree serves every sandbox without a shifted copy.
    """
    tree = _check(
        _libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC),
        f"open_tree {source}",
    )
    try:
        attr = _MountAttr(
            _MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, userns_fd
        )
        _check(
            _libc.syscall(_SYS_MOUNT_SETATTR, tree, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)),
            f"mount_setattr (id map) {source}",
        )
        _check(
            _libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, target.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
            f"move_mount {target}",
        )
    finally:
        os.close(tree)


def user_namespace(host_base: int, count: int) -> int:
    """A new user namespace whose ids 0..count-1 are host ids host_base..host_base+count-1.

    Returns an fd of it (``/proc/<pid>/ns/user`` of a short-lived child that made it). The caller
    must be root of the parent namespace. Call it before starting threads: it forks.
    """

    def write_maps(pid: int) -> None:
        mapping = f"0 {host_base} {count}\n"
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as handle:
                handle.write(mapping)

    return _new_user_namespace(write_maps)


def own_user_namespace(uid: int, gid: int, subids: tuple[tuple[int, int], tuple[int, int]] | None = None) -> int:
    """A new user namespace whose id 0 is the caller's own ``uid``/``gid`` (no privilege needed).

    With ``subids`` (the caller's subordinate uid and gid ranges, ``(start, count)`` each, from
    /etc/subuid and /etc/subgid), ids 1..count inside are those ranges, mapped by the setuid
    ``newuidmap``/``newgidmap`` of the ``uidmap`` package. Without, what an unprivileged user may map
    alone: one line, its own ids, ``setgroups`` denied first. Returns an fd of the namespace; call it
    before starting threads (it forks).
    """

    def write_maps(pid: int) -> None:
        if subids is None:
            for name, text in (("uid_map", f"0 {uid} 1\n"), ("setgroups", "deny"), ("gid_map", f"0 {gid} 1\n")):
                with open(f"/proc/{pid}/{name}", "w") as handle:
                    handle.write(text)
            return
        (uid_start, uid_count), (gid_start, gid_count) = subids
        for tool, own, start, count in (
            ("newuidmap", uid, uid_start, uid_count),
            ("newgidmap", gid, gid_start, gid_count),
        ):
            done = subprocess.run(
                [tool, str(pid), "0", str(own), "1", "1", str(start), str(count)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise OSError(f"{tool} failed: {(done.stderr or done.stdout).strip()}")

    return _new_user_namespace(write_maps)


def _new_user_namespace(write_maps: Callable[[int], None]) -> int:
    """Fork a child that makes a user namespace and waits; ``write_maps(child pid)`` maps its ids; returns
    an fd of the namespace (the child then exits)."""
    made_r, made_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only makes the namespace and waits to be told to exit
        try:
            os.close(made_r)
            os.close(go_w)
            unshare(CLONE_NEWUSER)
            os.write(made_w, b"1")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(made_w)
    os.close(go_r)
    try:
        if os.read(made_r, 1) != b"1":
            raise OSError("the child could not make a user namespace (unshare(CLONE_NEWUSER) failed)")
        write_maps(pid)
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(made_r)
        os.close(go_w)  # the child exits
        os.waitpid(pid, 0)


def enter_user_namespace(userns_fd: int) -> None:
    """Move the calling (single-threaded) process into ``userns_fd`` for good, as its root (the
    namespace's owner gets every capability in it)."""
    setns(userns_fd, CLONE_NEWUSER)


def probe_rootless_overlay(scratch: str) -> str | None:
    """Try what a rootless sandbox does: a user namespace of one's own ids, a mount namespace in it, a
    tmpfs, and an overlay whose lower layer is a directory of the caller's.

    ``scratch`` is an empty directory of the caller's (the lower layer and a mount point; only the
    probe's own mount namespace sees the mounts). Returns None when all of it works, else what failed.
    It runs util-linux's ``unshare`` and ``mount`` in a fresh process rather than forking this one: a
    fork of a process with threads of gRPC (a Pulumi provider) gets threads back in the child, and a
    process with threads may not make a user namespace.
    """
    lower = os.path.join(scratch, "lower")
    top = os.path.join(scratch, "top")
    os.mkdir(lower)
    os.mkdir(top)
    script = (
        'mount -t tmpfs -o size=1m,mode=0755 tmpfs "$1" && mkdir "$1/upper" "$1/work" "$1/merged" && '
        'mount -t overlay -o "lowerdir=$2,upperdir=$1/upper,workdir=$1/work" overlay "$1/merged"'
    )
    argv = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
    try:
        done = subprocess.run(
            [*argv, "sh", "-c", script, "probe", top, lower], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unshare: {exc}"
    if done.returncode != 0:
        return (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
    return None


def become_root_of(userns_fd: int) -> None:
    """In a child before exec: join the user namespace and become its root (uid and gid 0 there)."""
    setns(userns_fd, CLONE_NEWUSER)
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
