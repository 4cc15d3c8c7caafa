"""Bringing ephemeral stacks up and down: the runner's and the CLI's one way to get a sandbox.

An ephemeral stack holds exactly one unit (``u0``) so units can be destroyed independently and in
parallel. Its name records who made it (``sbx-`` for ``ale-iac sandbox create``, ``run-`` for
``ale-iac evaluate``) so that ``ale-iac gc`` can tell ephemeral stacks from pools.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from ale_iac.cloud_routes import KubernetesRoute
from ale_iac.contract import UNITS_OUTPUT, UnitOutputs, UnitSpec, parse_units
from ale_iac.engine import Engine, StackNotFoundError
from ale_iac.errors import AleIacError
from ale_iac.infra.program import inline_program
from ale_iac.paths import home_id
from ale_iac.profile import HostRoute, Profile
from ale_iac.sandbox.handle import SandboxHandle
from ale_iac.substrates import registry

UNIT_NAME = "u0"


def new_stack_name(prefix: str, *parts: str) -> str:
    """``<prefix>-<home id>-<parts>-<random>``, within Pulumi's stack-name charset."""
    clean = ["".join(c if c.isalnum() or c in "-_." else "-" for c in p)[:40] for p in parts if p]
    return "-".join([prefix, home_id(), *clean, secrets.token_hex(3)])


def made_here(stack: str, prefix: str) -> bool:
    """Whether ``stack`` is an ephemeral stack of kind ``prefix`` (``run``, ``sbx``) that this home made."""
    return stack.startswith(f"{prefix}-{home_id()}-")


def ensure_images(profile: Profile, log: Callable[[str], None] | None = None) -> None:
    """Make (or find in the cache) every image the profile's host routes need, before any unit is provisioned,
    so that a first build shows its progress on the console rather than inside a ``pulumi up``: the rootfs of
    each route's image, then what its substrate needs beyond it (``Substrate.prepare_images``: for ``qemu``
    the qcow2 export and, with ``runner: container``, the runner image). A profile that needs no qemu
    artifact never builds one."""
    from ale_iac import image_build

    by_substrate: dict[str, list[HostRoute]] = {}
    for route in profile.snapshots.values():
        if isinstance(route, HostRoute):
            by_substrate.setdefault(route.provider, []).append(route)
    for name in sorted({route.image for routes in by_substrate.values() for route in routes}):
        image_build.build_image(name) if log is None else image_build.build_image(name, log=log)
    for substrate, routes in by_substrate.items():
        registry.get(substrate).prepare_images(routes, log)
    if any(isinstance(route, KubernetesRoute) for route in profile.snapshots.values()):
        ensure_kube_plugin()


def ensure_kube_plugin() -> None:
    """The Pulumi Kubernetes provider plugin (``scripts/kube-cluster.sh build provider``: built from the Go module
    proxy on first need, ~10 min on 2 cores, then cached; its progress lines on stderr). The image is the
    cluster's to have: imported into its nodes or pushed to its registry (docs/kubernetes.md)."""
    import subprocess

    from ale_iac.paths import project_root
    from ale_iac.toolchain import kube_bin_dir

    if (kube_bin_dir() / "pulumi-resource-kubernetes").is_file():
        return
    script = project_root() / "scripts" / "kube-cluster.sh"
    done = subprocess.run(["bash", str(script), "build", "provider"], stdout=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        raise AleIacError(f"{script} build provider failed (exit {done.returncode}; its output is above)")


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
    return SandboxHandle.from_outputs(
        stack, up_units(engine, profile, stack, [unit], on_output, initialized)[unit.name]
    )


def up_units(
    engine: Engine,
    profile: Profile,
    stack: str,
    units: list[UnitSpec],
    on_output: Callable[[str], None] | None = None,
    initialized: bool = False,
) -> dict[str, UnitOutputs]:
    """Declare ``units`` in a new stack of their own, in one ``up``; what the stack exports of each, by unit
    name. As :func:`up_unit`: a failed ``up`` leaves no stack behind."""
    resolved: list[dict[str, Any]] = []
    try:
        program = inline_program(profile, units, stack, on_units=resolved.append)
        engine.up_new(stack, program, on_output=on_output, initialized=initialized)
        if not resolved:
            raise AleIacError(f"stack '{stack}' exports no '{UNITS_OUTPUT}' output")
        exported = parse_units(resolved[-1])
        missing = [unit.name for unit in units if unit.name not in exported]
        if missing:
            raise AleIacError(f"stack '{stack}' did not export unit '{missing[0]}'")
        return {unit.name: exported[unit.name] for unit in units}
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
