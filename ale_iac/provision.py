"""Bringing ephemeral stacks up and down: the runner's and the CLI's one way to get a sandbox.

An ephemeral stack holds exactly one unit (``u0``) so units can be destroyed independently and in
parallel. Its name records who made it (``sbx-`` for ``ale-iac sandbox create``, ``run-`` for
``ale-iac evaluate``) so that ``ale-iac gc`` can tell ephemeral stacks from pools.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from ale_iac.contract import UNITS_OUTPUT, UnitSpec, parse_units
from ale_iac.engine import Engine, StackNotFoundError
from ale_iac.errors import AleIacError
from ale_iac.infra.program import inline_program
from ale_iac.paths import home_id
from ale_iac.profile import DockerRoute, LocalRoute, Profile, QemuRoute
from ale_iac.sandbox.handle import SandboxHandle

UNIT_NAME = "u0"


def new_stack_name(prefix: str, *parts: str) -> str:
    """``<prefix>-<home id>-<parts>-<random>``, within Pulumi's stack-name charset."""
    clean = ["".join(c if c.isalnum() or c in "-_." else "-" for c in p)[:40] for p in parts if p]
    return "-".join([prefix, home_id(), *clean, secrets.token_hex(3)])


def made_here(stack: str, prefix: str) -> bool:
    """Whether ``stack`` is an ephemeral stack of kind ``prefix`` (``run``, ``sbx``) that this home made."""
    return stack.startswith(f"{prefix}-{home_id()}-")


def ensure_images(profile: Profile, log: Callable[[str], None] | None = None) -> None:
    """Build (or find in the cache) every image the profile's host routes use, before any unit is provisioned,
    so that a first build shows its progress on the console rather than inside a ``pulumi up``: the rootfs of
    local, docker and qemu routes; for qemu routes also the qcow2 export and, with ``runner: container``, the
    runner image's rootfs. Nothing else is made: a profile that needs no qemu artifact never builds one."""
    from ale_iac.images import build_image, ensure_qcow2_image
    from ale_iac.infra.qemu import RUNNER_IMAGE

    kwargs: dict[str, Any] = {} if log is None else {"log": log}
    routes = profile.snapshots.values()
    host = [r for r in routes if isinstance(r, LocalRoute | DockerRoute | QemuRoute)]
    qemu = [r for r in host if isinstance(r, QemuRoute)]
    for name in sorted({r.image for r in host}):
        build_image(name, **kwargs)
    for name in sorted({r.image for r in qemu}):
        ensure_qcow2_image(name, **kwargs)
    if any(r.runner == "container" for r in qemu):
        build_image(RUNNER_IMAGE, **kwargs)


def up_unit(
    engine: Engine,
    profile: Profile,
    stack: str,
    unit: UnitSpec,
    on_output: Callable[[str], None] | None = None,
    initialized: bool = False,
) -> SandboxHandle:
    """Declare one unit in its own stack and return its handle (``initialized``: ``Engine.init`` made
    the stack already).

    If ``up`` fails, whatever it created is destroyed before the error propagates, so a failed
    create leaves no stack behind.
    """
    resolved: list[dict[str, Any]] = []
    try:
        program = inline_program(profile, [unit], stack, on_units=resolved.append)
        engine.up_new(stack, program, on_output=on_output, initialized=initialized)
        if not resolved:
            raise AleIacError(f"stack '{stack}' exports no '{UNITS_OUTPUT}' output")
        units = parse_units(resolved[-1])
        if unit.name not in units:
            raise AleIacError(f"stack '{stack}' did not export unit '{unit.name}'")
        return SandboxHandle.from_outputs(stack, units[unit.name])
    except BaseException:
        destroy_stack(engine, stack)
        raise


def destroy_stack(engine: Engine, stack: str) -> bool:
    """Destroy and remove a stack; False if it did not exist. Recovers a stale lock first."""
    try:
        engine.recover(stack)
    except StackNotFoundError:
        return False
    return True
