"""The ``qemu`` substrate's unit as the isolation suite sees it from the host (``ale_iac.substrates.isolation``).

The guest runs a kernel of its own: the boundary is the virtual machine. So the checks of what root inside
may do to its kernel are the guest's business and do not apply; what applies is what the guest reaches (the
endpoint, host paths, the network: ``tests/substrates/qemu``) and what the QEMU process may do on the host:
it runs as the unit's own unprivileged host id with no capability (``host-process-unprivileged``) and under
its own seccomp filter (``host-process-confined``), so a guest that breaks out of the emulator is that id.
"""

from __future__ import annotations

from pathlib import Path

from ale_iac.substrates import isolation
from ale_iac.substrates.qemu.runtime import QemuSandboxState

_GUEST_KERNEL = "the guest runs a kernel of its own, walled off by the virtual machine: "
NOT_APPLICABLE = {
    isolation.ROOT_UNPRIVILEGED: _GUEST_KERNEL + "root in the guest is root of the guest's kernel only; the QEMU "
    "process on the host runs as an unprivileged host id of the unit's own (checked by host-process-unprivileged)",
    isolation.KERNEL_SETTINGS: _GUEST_KERNEL + "the guest's /proc/sys is its own kernel's settings",
    isolation.NO_USERNS_INSIDE: _GUEST_KERNEL + "namespaces made inside are the guest kernel's",
    isolation.NO_NAMESPACE_DESCRIPTOR: _GUEST_KERNEL + "no descriptor of the host crosses into a guest; its "
    "namespaces are the guest kernel's",
    isolation.SECCOMP: _GUEST_KERNEL + "its system calls never reach the host's; the QEMU process has its own "
    "filter (-sandbox, checked by host-process-confined)",
    isolation.CAPABILITIES: _GUEST_KERNEL + "root in the guest holds every capability of its own kernel, none of "
    "the host's",
    isolation.SETUID_FILES: _GUEST_KERNEL + "a setuid file raises only inside the guest; the unit folder's modes are "
    "checked in tests/substrates/qemu (0700, files 0600)",
    isolation.NO_HOST_FILE_WRITABLE: _GUEST_KERNEL + "no host file system is mounted in the guest but its share, "
    "a folder of the unit's own",
    isolation.WRITABLE_NOSUID: _GUEST_KERNEL + "a setuid file raises only inside the guest's own kernel",
    isolation.DISK_BOUNDED: "the guest's disk is a qcow2 overlay that grows at most to the base disk's virtual size",
    isolation.HOST_READS_SAFELY: "the host reads no file the guest wrote but through QMP and the share's regular files",
    isolation.NETWORK_LOOPBACK_ONLY: "the guest has user-mode networking with restrict=on (no outbound), checked "
    "in tests/substrates/qemu/test_runtime.py",
    isolation.TASKS_BOUNDED: _GUEST_KERNEL + "its task count is its own kernel's; its vCPUs and memory bound it",
    isolation.CGROUPS_OUT_OF_REACH: _GUEST_KERNEL + "its cgroups are its own kernel's",
}


class QemuIsolation:
    """A guest: on the host, one QEMU process and the unit folder."""

    def __init__(self, state: QemuSandboxState) -> None:
        self.state = state

    def host_pids(self) -> list[int]:
        return [self.state.pid] if self.state.pid else []

    def host_paths(self) -> list[Path]:
        return [self.state.unit_dir]

    def read_log(self, name: str) -> str:
        raise NotImplementedError(NOT_APPLICABLE[isolation.HOST_READS_SAFELY])

    def tasks_in_use(self) -> int:
        """The QEMU process's threads (vCPUs and I/O): the guest's own tasks are its kernel's."""
        return isolation.threads_of(self.host_pids())

    def not_applicable(self, check: str) -> str | None:
        isolation.unknown_check(check)
        return NOT_APPLICABLE.get(check)
