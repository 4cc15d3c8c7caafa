"""Bringing ephemeral stacks up and down: the runner's and the CLI's one way to get a sandbox.

An ephemeral stack holds exactly one unit (``u0``) so units can be destroyed independently and in
parallel. Its name records who made it (``sbx-`` for ``ale-iac sandbox create``, ``run-`` for
``ale-iac evaluate``) so that ``ale-iac gc`` can tell ephemeral stacks from pools.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping
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
        return _exported(stack, units, resolved)
    except BaseException:
        destroy_stack(engine, stack)
        raise


def update_units(
    engine: Engine,
    profile: Profile,
    stack: str,
    units: list[UnitSpec],
    targets: list[str],
    replace: list[str],
    kept: Mapping[str, UnitOutputs],
) -> dict[str, UnitOutputs]:
    """One targeted ``up`` of a stack (``Engine.update_targets``) whose program declares only ``units``: the update
    changes ``targets`` alone (a target the program does not declare is deleted, with what depends on it) and
    replaces ``replace``; the stack's other units, ``kept``, are left as they are and exported as they were. So
    an update's program costs what it changes, not what the stack holds. What the stack exports of each unit
    then, by name."""
    resolved: list[dict[str, Any]] = []
    as_they_are = {name: unit.to_output() for name, unit in kept.items()}
    program = inline_program(profile, units, stack, on_units=resolved.append, kept=as_they_are)
    engine.update_targets(stack, program, targets, replace)
    return parse_units(resolved[-1]) if resolved else {}


def _exported(stack: str, units: list[UnitSpec], resolved: list[dict[str, Any]]) -> dict[str, UnitOutputs]:
    """What the stack's program handed over of each unit (``inline_program``'s ``on_units``), by unit name."""
    if not resolved:
        raise AleIacError(f"stack '{stack}' exports no '{UNITS_OUTPUT}' output")
    exported = parse_units(resolved[-1])
    missing = [unit.name for unit in units if unit.name not in exported]
    if missing:
        raise AleIacError(f"stack '{stack}' did not export unit '{missing[0]}'")
    return {unit.name: exported[unit.name] for unit in units}


class UpAhead:
    """A unit's ``pulumi up`` started before the unit's turn, held in its program until :meth:`go`.

    Everything of an ``up`` that does not depend on the moment runs while the unit waits: the CLI's start,
    the stack's key derivation (PBKDF2, about 0.2 s of CPU), reading its state, the language runtime's
    handshake. That was 0.5 of the 0.7 s a local unit's ``up`` took on its critical path (``-v=7`` log of the
    CLI, ``docs/benchmarks.md``). The program then waits at its first line (``inline_program``'s ``gate``)
    before it declares anything, so nothing exists yet: :meth:`drop` lets it declare nothing, and a
    stack left by a crash meanwhile is an empty one the run had claimed (``ale-iac gc`` removes it).

    The stack must exist (``Engine.init``). The ``up`` runs in a thread of its own, started here.
    """

    def __init__(self, engine: Engine, profile: Profile, stack: str, unit: UnitSpec) -> None:
        self.engine, self.stack, self.unit = engine, stack, unit
        self._decided = threading.Condition()
        self._declare: bool | None = None
        self._resolved: list[dict[str, Any]] = []
        self._error: BaseException | None = None
        program = inline_program(profile, [unit], stack, on_units=self._resolved.append, gate=self._wait)
        self._thread = threading.Thread(target=self._up, args=(program,), name=f"up-ahead-{stack}", daemon=True)
        self._thread.start()

    def _up(self, program: Callable[[], None]) -> None:
        try:
            self.engine.up_new(self.stack, program, initialized=True)
        except BaseException as exc:
            self._error = exc
        finally:
            # An update that ended before the unit's turn (its CLI failed or was killed) leaves no program
            # waiting for a decision that will never come.
            self._decide(False)

    def _wait(self) -> bool:
        with self._decided:
            self._decided.wait_for(lambda: self._declare is not None)
            return bool(self._declare)

    def _decide(self, declare: bool) -> None:
        with self._decided:
            if self._declare is None:
                self._declare = declare
                self._decided.notify_all()

    def go(self) -> SandboxHandle:
        """Let the program declare the unit; the handle once the ``up`` is done. As :func:`up_unit`: if the
        ``up`` failed (now or while it waited) the stack is destroyed before the error propagates."""
        self._decide(True)
        self._thread.join()
        try:
            if self._error is not None:
                raise self._error
            if not self._declare:
                raise AleIacError(f"stack '{self.stack}': its update ended before the unit was declared")
            outputs = _exported(self.stack, [self.unit], self._resolved)[self.unit.name]
        except BaseException:
            destroy_stack(self.engine, self.stack)
            raise
        return SandboxHandle.from_outputs(self.stack, outputs)

    def drop(self) -> None:
        """Let the program declare nothing and wait for the ``up`` to end; the (empty) stack stays, for the
        caller to remove. Whatever failed meanwhile is not raised: nothing was made."""
        self._decide(False)
        self._thread.join()


def destroy_stack(engine: Engine, stack: str) -> bool:
    """Destroy and remove a stack; False if it did not exist. Recovers a stale lock first."""
    try:
        engine.recover(stack)
    except StackNotFoundError:
        return False
    return True
