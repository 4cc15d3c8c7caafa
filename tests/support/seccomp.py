"""The seccomp probes shared by ``tests/substrates/test_seccomp.py`` (on the host, with and without the
filter) and ``tests/substrates/test_isolation.py`` (inside a real sandbox): one representative call per
rule family of ``ale_iac.substrates.seccomp.SANDBOX_POLICY``, and the script that makes it.
"""

from __future__ import annotations

import textwrap

import pyseccomp

from ale_iac.substrates.seccomp import CLONE_NEWUSER, TIOCSTI


def nr(name: str) -> int:
    """The native number of syscall ``name`` (negative when this architecture has no such call)."""
    return int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))


# One representative call per family: (syscall, args). Arguments are chosen so that, without the
# filter, the kernel answers a root caller with something other than the family's errno, and nothing
# on the host changes (bad pointers, bad flags, read-only queries).
PROBES: dict[str, tuple[str, tuple[int, ...]]] = {
    "user-namespaces": ("unshare", (CLONE_NEWUSER,)),
    "clone3": ("clone3", (0, 0)),
    "namespaces": ("setns", (2**31 - 1, 0)),
    "keyring": ("keyctl", (0, 2**32 - 4, 0)),  # KEYCTL_GET_KEYRING_ID of the user keyring
    "bpf": ("bpf", (2**31 - 1, 0, 0)),
    "perf": ("perf_event_open", (0, 0, 2**32 - 1, 2**32 - 1, 0)),
    "userfaultfd": ("userfaultfd", (0xFFFF,)),
    "io-uring": ("io_uring_setup", (1, 0)),
    "mount": ("mount_setattr", (2**32 - 1, 0, 0xFFFF, 0, 0)),
    "kernel-modules": ("delete_module", (0, 0)),
    "kexec": ("kexec_load", (0, 0, 0, 0xFFFFFFFF)),
    "host-system": ("reboot", (0, 0, 0, 0)),  # a wrong magic number: the kernel answers EINVAL
    "file-handles": ("open_by_handle_at", (2**32 - 1, 0, 0)),
    "tty-injection": ("ioctl", (2**31 - 1, TIOCSTI, 0)),
    "tty-linux": ("ioctl", (2**31 - 1, 0x541C, 0)),
}

PROBE_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    number, args, filter_path = json.loads(sys.argv[1])
    if filter_path:
        program = open(filter_path, "rb").read()
        class SockFprog(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
        prog = SockFprog(len(program) // 8, program)
        assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
        assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0, ctypes.get_errno()  # SECCOMP_MODE_FILTER
    result = libc.syscall(number, *[ctypes.c_ulong(a) for a in args])
    print(json.dumps({"result": result, "errno": ctypes.get_errno() if result < 0 else 0}))
    """
)
