"""The seccomp policy of every sandbox ale-iac runs on this host, written as data.

In the spirit of Docker's default profile: everything is allowed except the calls below, which
fail with ``EPERM`` (``clone3`` fails with ``ENOSYS`` instead, so that the C library falls back to
``clone``, whose flags a classic BPF filter can inspect). Each family names why it is denied; the
isolation suite (``tests/substrates/test_isolation.py``) checks every family from inside a real
sandbox.

:func:`compile_bpf` turns the policy into the classic BPF program that bubblewrap loads with
``--seccomp FD``, through libseccomp (the ``pyseccomp`` ctypes binding; libseccomp resolves the
syscall names for the host's architecture and rejects foreign ABIs such as x32). :func:`docker_profile`
renders the same policy in the container engine's JSON profile format (``--security-opt seccomp=...``), so
that a docker unit refuses the same families with the same errno.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import Any, Final

CLONE_NEWUSER: Final = 0x10000000
TIOCSTI: Final = 0x5412
TIOCLINUX: Final = 0x541C


@dataclass(frozen=True)
class ArgMatch:
    """Deny only when ``(arg[index] & mask) == value``."""

    index: int
    mask: int
    value: int


@dataclass(frozen=True)
class RuleFamily:
    """Syscalls denied together, for one reason."""

    name: str
    why: str
    syscalls: tuple[str, ...]
    errno: int = errno.EPERM
    when: ArgMatch | None = None
    """Deny only calls whose argument matches; None denies every call."""


@dataclass(frozen=True)
class SeccompPolicy:
    families: tuple[RuleFamily, ...] = field(default_factory=tuple)

    def family(self, name: str) -> RuleFamily:
        for family in self.families:
            if family.name == name:
                return family
        raise KeyError(name)


SANDBOX_POLICY: Final = SeccompPolicy(
    families=(
        RuleFamily(
            "user-namespaces",
            "a new user namespace hands its creator a full capability set, and with it kernel surface "
            "meant for root (the sandbox already is in its own user namespace)",
            ("unshare", "clone"),
            when=ArgMatch(0, CLONE_NEWUSER, CLONE_NEWUSER),
        ),
        RuleFamily(
            "clone3",
            "clone3 passes its flags in memory, out of a filter's reach: ENOSYS makes the C library use clone",
            ("clone3",),
            errno=errno.ENOSYS,
        ),
        RuleFamily(
            "namespaces",
            "joining another namespace is never needed inside a sandbox",
            ("setns",),
        ),
        RuleFamily(
            "keyring",
            "the kernel keyring is not namespaced by mount or pid namespaces",
            ("keyctl", "add_key", "request_key"),
        ),
        RuleFamily("bpf", "eBPF programs and maps are kernel-wide", ("bpf",)),
        RuleFamily("perf", "performance events observe the whole host", ("perf_event_open",)),
        RuleFamily("userfaultfd", "a classic tool for winning kernel races", ("userfaultfd",)),
        RuleFamily(
            "io-uring",
            "io_uring bypasses this filter for every operation it performs and has a long CVE history",
            ("io_uring_setup", "io_uring_enter", "io_uring_register"),
        ),
        RuleFamily(
            "mount",
            "the sandbox's mounts are fixed when it starts",
            (
                "mount",
                "umount2",
                "pivot_root",
                "fsopen",
                "fsconfig",
                "fsmount",
                "fspick",
                "move_mount",
                "open_tree",
                "mount_setattr",
            ),
        ),
        RuleFamily(
            "kernel-modules",
            "loading code into the host kernel",
            ("init_module", "finit_module", "delete_module"),
        ),
        RuleFamily("kexec", "replacing the host kernel", ("kexec_load", "kexec_file_load")),
        RuleFamily(
            "host-system",
            "calls that act on the whole host: reboot, swap, accounting, clocks, kernel log, quotas",
            (
                "reboot",
                "swapon",
                "swapoff",
                "acct",
                "settimeofday",
                "clock_settime",
                "clock_adjtime",
                "adjtimex",
                "syslog",
                "quotactl",
                "vhangup",
                "iopl",
                "ioperm",
                "lookup_dcookie",
            ),
        ),
        RuleFamily(
            "file-handles",
            "open_by_handle_at opens any inode of a file system by number, past every mount (the 'shocker' escape)",
            ("open_by_handle_at", "name_to_handle_at"),
        ),
        RuleFamily(
            "tty-injection",
            "TIOCSTI pushes input into a terminal that another process reads",
            ("ioctl",),
            when=ArgMatch(1, 0xFFFFFFFF, TIOCSTI),
        ),
        RuleFamily(
            "tty-linux",
            "TIOCLINUX reaches the host's virtual consoles",
            ("ioctl",),
            when=ArgMatch(1, 0xFFFFFFFF, TIOCLINUX),
        ),
    )
)


def compile_bpf(policy: SeccompPolicy = SANDBOX_POLICY) -> bytes:
    """The policy as a classic BPF program for this host's architecture (``bwrap --seccomp``).

    Syscalls this kernel's architecture does not have are skipped (libseccomp cannot name them).
    """
    import tempfile

    import pyseccomp

    program = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for family in policy.families:
        action = pyseccomp.ERRNO(family.errno)
        for name in family.syscalls:
            if pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) < 0:
                continue  # not a syscall of this architecture
            if family.when is None:
                program.add_rule(action, name)
            else:
                match = family.when
                program.add_rule(action, name, pyseccomp.Arg(match.index, pyseccomp.MASKED_EQ, match.mask, match.value))
    # libseccomp writes the program to a file descriptor.
    with tempfile.TemporaryFile() as sink:
        program.export_bpf(sink)
        sink.seek(0)
        return sink.read()


def docker_profile(policy: SeccompPolicy = SANDBOX_POLICY) -> dict[str, Any]:
    """The policy in the Docker engine's (runc's) seccomp profile format: allow by default, and one rule per
    family with its errno (``errnoRet``). An argument match is ``SCMP_CMP_MASKED_EQ`` with the mask in
    ``value`` and the compared value in ``valueTwo``, as runc passes them to libseccomp. Only the native
    architecture is listed: a foreign ABI (x32, i386) is refused as a whole, as :func:`compile_bpf`'s is.
    runc skips a name its libseccomp does not know, as :func:`compile_bpf` does."""
    rules: list[dict[str, Any]] = []
    for family in policy.families:
        rule: dict[str, Any] = {
            "names": list(family.syscalls),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": family.errno,
            "comment": f"{family.name}: {family.why}",
        }
        if family.when is not None:
            match = family.when
            rule["args"] = [
                {"index": match.index, "value": match.mask, "valueTwo": match.value, "op": "SCMP_CMP_MASKED_EQ"}
            ]
        rules.append(rule)
    return {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}
