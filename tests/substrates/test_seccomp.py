"""The sandboxes' seccomp policy: the compiled program, then each rule family against the real kernel.

Two levels, both able to fail:

* the BPF program libseccomp compiles from ``SANDBOX_POLICY`` is run through a small classic-BPF
  interpreter for every syscall the policy names (and for calls it must let through);
* a child process on the host loads the program and makes one representative call per family,
  with arguments for which the kernel, without the filter, answers something other than the
  filter's errno (the control call is made too, so a kernel that refuses the call anyway cannot
  make the test pass by accident).

The same filter inside a real sandbox is checked by ``test_isolation.py``.
"""

from __future__ import annotations

import errno
import json
import struct
import subprocess
import sys
from dataclasses import dataclass

import pytest

from ale_iac.substrates.seccomp import CLONE_NEWUSER, SANDBOX_POLICY, TIOCSTI, ArgMatch, compile_bpf, docker_profile
from tests.support.seccomp import PROBE_SCRIPT, PROBES, nr

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_I386 = 0x40000003
X32_SYSCALL_BIT = 0x40000000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ACTION_FULL = 0xFFFF0000


def native_arch() -> int:
    machine = __import__("platform").machine()
    return {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}[machine]


# --- a classic BPF interpreter, for the opcodes a seccomp program uses ----------------------------------


@dataclass(frozen=True)
class Instruction:
    code: int
    jt: int
    jf: int
    k: int


def decode(program: bytes) -> list[Instruction]:
    assert len(program) % 8 == 0 and program, "a BPF program is a non-empty array of 8-byte instructions"
    return [Instruction(*struct.unpack_from("=HBBI", program, i)) for i in range(0, len(program), 8)]


def seccomp_data(number: int, arch: int, args: tuple[int, ...] = ()) -> bytes:
    padded = (list(args) + [0] * 6)[:6]
    return struct.pack("=iIQ6Q", number, arch, 0, *padded)


def run_bpf(program: list[Instruction], data: bytes) -> int:  # noqa: C901, PLR0912 (an interpreter: a branch per opcode)
    """Evaluate ``program`` on ``data``; returns the 32-bit return value. Unknown opcodes fail the test."""
    a = x = 0
    memory = [0] * 16
    pc = 0
    for _ in range(4096):
        ins = program[pc]
        op = ins.code
        pc += 1
        if op == 0x20:  # LD W ABS
            a = struct.unpack_from("=I", data, ins.k)[0]
        elif op == 0x00:  # LD IMM
            a = ins.k
        elif op == 0x60:  # LD MEM
            a = memory[ins.k]
        elif op == 0x61:  # LDX MEM
            x = memory[ins.k]
        elif op == 0x02:  # ST
            memory[ins.k] = a
        elif op == 0x03:  # STX
            memory[ins.k] = x
        elif op == 0x54:  # ALU AND K
            a &= ins.k
        elif op == 0x07:  # TAX
            x = a
        elif op == 0x87:  # TXA
            a = x
        elif op == 0x05:  # JA
            pc += ins.k
        elif op in (0x15, 0x25, 0x35, 0x45, 0x1D, 0x2D, 0x3D, 0x4D):  # JEQ/JGT/JGE/JSET, K or X
            operand = x if op & 0x08 else ins.k
            kind = op & 0xF0
            taken = {
                0x10: a == operand,
                0x20: a > operand,
                0x30: a >= operand,
                0x40: bool(a & operand),
            }[kind]
            pc += ins.jt if taken else ins.jf
        elif op == 0x06:  # RET K
            return ins.k
        elif op == 0x16:  # RET A
            return a
        else:
            raise AssertionError(f"unhandled BPF opcode {op:#x} at {pc - 1}")
    raise AssertionError("the program did not return within 4096 steps")


@pytest.fixture(scope="module")
def program() -> list[Instruction]:
    return decode(compile_bpf())


def verdict(program: list[Instruction], name: str, args: tuple[int, ...] = ()) -> int:
    return run_bpf(program, seccomp_data(nr(name), native_arch(), args))


# --- the compiled program ----------------------------------------------------------------------------------


def test_every_denied_syscall_gets_its_errno(program: list[Instruction]) -> None:
    checked = 0
    for family in SANDBOX_POLICY.families:
        args: tuple[int, ...] = ()
        if family.when is not None:
            args = tuple(family.when.value if i == family.when.index else 0 for i in range(6))
        for name in family.syscalls:
            if nr(name) < 0:
                continue  # not a syscall of this architecture
            assert verdict(program, name, args) == SECCOMP_RET_ERRNO | family.errno, (family.name, name)
            checked += 1
    assert checked >= 40


def test_conditional_rules_deny_only_the_matching_calls(program: list[Instruction]) -> None:
    clone_flags = 0x01000000 | 0x00200000 | 17  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD, as fork()
    assert verdict(program, "clone", (clone_flags,)) == SECCOMP_RET_ALLOW
    assert verdict(program, "clone", (clone_flags | CLONE_NEWUSER,)) == SECCOMP_RET_ERRNO | errno.EPERM
    assert verdict(program, "unshare", (0x00020000,)) == SECCOMP_RET_ALLOW  # CLONE_NEWNS: left to capabilities
    assert verdict(program, "ioctl", (1, 0x5401)) == SECCOMP_RET_ALLOW  # TCGETS
    assert verdict(program, "ioctl", (1, TIOCSTI)) == SECCOMP_RET_ERRNO | errno.EPERM
    # Only the low 32 bits of an ioctl request count, as in the kernel.
    assert verdict(program, "ioctl", (1, (1 << 32) | TIOCSTI)) == SECCOMP_RET_ERRNO | errno.EPERM


@pytest.mark.parametrize(
    "name", ["read", "write", "openat", "execve", "mmap", "socket", "connect", "ptrace", "chown", "wait4"]
)
def test_ordinary_calls_are_allowed(program: list[Instruction], name: str) -> None:
    assert verdict(program, name, (3, 0, 0)) == SECCOMP_RET_ALLOW


def test_foreign_abis_are_killed(program: list[Instruction]) -> None:
    """32-bit and x32 entry points have other numbers: they must never slip past the native table."""
    foreign = AUDIT_ARCH_I386 if native_arch() == AUDIT_ARCH_X86_64 else AUDIT_ARCH_X86_64
    assert run_bpf(program, seccomp_data(0, foreign)) & SECCOMP_RET_ACTION_FULL not in (
        SECCOMP_RET_ALLOW,
        SECCOMP_RET_ERRNO,
    )
    if native_arch() == AUDIT_ARCH_X86_64:
        x32_keyctl = X32_SYSCALL_BIT | nr("keyctl")
        assert run_bpf(program, seccomp_data(x32_keyctl, AUDIT_ARCH_X86_64)) != SECCOMP_RET_ALLOW


def test_the_policy_is_well_formed() -> None:
    names = [family.name for family in SANDBOX_POLICY.families]
    assert len(names) == len(set(names))
    for family in SANDBOX_POLICY.families:
        assert family.why and family.syscalls
        assert family.errno in (errno.EPERM, errno.ENOSYS)
        if family.when is not None:
            assert isinstance(family.when, ArgMatch) and 0 <= family.when.index < 6


# --- each family against the kernel ------------------------------------------------------------------------
# The probes (one representative call per family) are in tests/support/seccomp.py, shared with test_isolation.py.


def probe(number: int, args: tuple[int, ...], filter_path: str | None) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE_SCRIPT, json.dumps([number, list(args), filter_path])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reply: dict[str, int] = json.loads(done.stdout)
    return reply


def test_every_family_has_a_probe() -> None:
    assert set(PROBES) == {family.name for family in SANDBOX_POLICY.families}


# The control calls are chosen for root: without CAP_SYS_BOOT, reboot answers EPERM (the family's errno)
# before it looks at its magic number.
@pytest.mark.parametrize(
    "family_name",
    [pytest.param(name, marks=pytest.mark.needs_root) if name == "host-system" else name for name in sorted(PROBES)],
)
def test_each_family_is_enforced_by_the_kernel(family_name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    family = SANDBOX_POLICY.family(family_name)
    syscall, args = PROBES[family_name]
    assert syscall in family.syscalls
    number = nr(syscall)
    if number < 0:
        pytest.skip(f"{syscall} is not a syscall of this architecture")
    bpf = tmp_path_factory.mktemp("seccomp") / "filter.bpf"
    bpf.write_bytes(compile_bpf())
    control = probe(number, args, None)
    if control["errno"] == family.errno:
        pytest.fail(f"{syscall}{args} fails with {errno.errorcode[family.errno]} without the filter: pick other args")
    filtered = probe(number, args, str(bpf))
    assert filtered == {"result": -1, "errno": family.errno}, (control, filtered)


def test_the_docker_profile_is_the_same_policy() -> None:
    """The engine's JSON profile allows by default and denies exactly the policy's calls, each with its
    family's errno; an argument match keeps its mask and value (runc: ``value`` is the mask)."""
    profile = docker_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW" and "architectures" not in profile
    assert len(profile["syscalls"]) == len(SANDBOX_POLICY.families)
    for family, rule in zip(SANDBOX_POLICY.families, profile["syscalls"], strict=True):
        assert rule["names"] == list(family.syscalls) and rule["action"] == "SCMP_ACT_ERRNO"
        assert rule["errnoRet"] == family.errno and rule["comment"].startswith(family.name + ":")
        if family.when is None:
            assert "args" not in rule
        else:
            (arg,) = rule["args"]
            assert (arg["index"], arg["value"], arg["valueTwo"]) == (
                family.when.index,
                family.when.mask,
                family.when.value,
            )
            assert arg["op"] == "SCMP_CMP_MASKED_EQ"
    denied = {name for rule in profile["syscalls"] for name in rule["names"]}
    assert {"io_uring_setup", "io_uring_enter", "io_uring_register", "clone3", "bpf"} <= denied
    assert json.loads(json.dumps(profile)) == profile  # what the engine gets is plain JSON
