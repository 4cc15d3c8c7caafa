"""How a pool unit gets back to its image's clean state between leases: the ``reset`` of its route.

* ``restore`` (the default of the host substrates): the unit's substrate remakes it under the same sandbox
  id, so the same Pulumi resource (``Substrate.reset``: ``local`` a fresh sandbox, ``docker`` a new container
  with new volumes and a new network, ``qemu`` a guest restored from the saved memory state onto a fresh
  overlay). Each gets a new endpoint port and token, which :func:`ale_iac.engine.live_outputs` reads from the
  substrate.
* ``recreate`` (the default of the cloud kinds; any host kind can ask for it): the pool stack replaces the
  unit's resources (``reset_urns`` of its outputs: a VM, a container, a sandbox) through the real engine,
  ``pulumi up --replace URN --target URN``, run with the pool's own program (:func:`pool_project`). The new
  resource has new outputs (endpoint, token, resource id); a lease of such a unit reads them from the stack.
* ``none`` (``static``, or a route that says so): leased as it is.

A stack made before units carried ``reset`` gets its substrate's restore where there is one.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from ale_iac.contract import ResetMode, UnitOutputs
from ale_iac.engine import Engine, StackLockedError, live_outputs
from ale_iac.errors import AleIacError
from ale_iac.paths import ale_home, project_root
from ale_iac.runner import leases
from ale_iac.runner.batches import Batches
from ale_iac.substrates import registry
from ale_iac.substrates.base import Capability

Reset = Callable[[UnitOutputs], UnitOutputs]
"""Resets a unit; returns its handle then (new endpoint and token)."""

RECREATE_LOCK_WAIT_S = 1800.0
"""How long a recreate waits for the pool stack while another process (or host) updates it."""
_LOCK_POLL_S = 2.0


def restore(unit: UnitOutputs) -> UnitOutputs:
    """A fresh unit under the same id from its substrate (:attr:`Capability.RESTORE`); returns its handle then."""
    substrate = registry.require_of(unit, Capability.RESTORE, f"unit {unit.unit} is reset by 'restore'")
    substrate.reset(unit.resource_id)
    return live_outputs(unit)


def _can_restore(unit: UnitOutputs) -> bool:
    substrate = registry.of_unit(unit)
    return substrate is not None and Capability.RESTORE in substrate.capabilities


def mode_of(unit: UnitOutputs) -> ResetMode:
    """The unit's reset: what its route declared, else (an older stack) its substrate's restore if it has one."""
    if unit.reset is not None:
        return unit.reset
    return "restore" if _can_restore(unit) else "none"


def reset_of(stack: str, unit: UnitOutputs) -> Reset | None:
    """How to reset ``unit`` of pool ``stack``; None when it is leased as it is."""
    mode = mode_of(unit)
    if mode == "restore":
        return restore
    if mode == "recreate":
        return functools.partial(recreate, stack)
    return None


def current_outputs(stack: str, unit: UnitOutputs) -> UnitOutputs:
    """The unit's handle as it is now: a restored unit's from its substrate; a recreated unit's from the
    stack (its resource id changes with each recreation, so what a run read when it started is stale)."""
    if mode_of(unit) == "recreate":
        return _unit_of(_engine(), stack, unit.unit)
    return live_outputs(unit)


def _engine() -> Engine:
    """This home's engine (on the backend the environment names), made once: making one runs the CLI."""
    return _engine_of(str(ale_home()), os.environ.get("PULUMI_BACKEND_URL"))


@functools.lru_cache(maxsize=4)
def _engine_of(home: str, backend: str | None) -> Engine:
    del backend  # part of the key: Engine reads it from the environment
    return Engine(Path(home))


# --- recreate ------------------------------------------------------------------------------------------


def pool_project(stack: str) -> Path:
    """The project whose program brings pool ``stack`` up: the first of the current directory and ale-iac's
    own source tree with a ``Pulumi.yaml`` and the stack's config file ``stacks/Pulumi.<stack>.yaml``."""
    candidates = list(dict.fromkeys([Path.cwd().resolve(), project_root()]))
    for folder in candidates:
        if (folder / "Pulumi.yaml").is_file() and (folder / "stacks" / f"Pulumi.{stack}.yaml").is_file():
            return folder
    raise AleIacError(
        f"pool '{stack}' recreates its units with its own program, and no project has it: none of "
        f"{', '.join(str(c) for c in candidates)} has Pulumi.yaml and stacks/Pulumi.{stack}.yaml "
        "(run from the checkout the pool was brought up from)"
    )


def recreate(stack: str, unit: UnitOutputs) -> UnitOutputs:
    """Replace the unit's resources through the engine; returns its new handle (read from the stack).

    Recreations of one stack asked for while one runs (other units of the same run) go together into
    the next ``pulumi up``; one of another process waits for the stack's lock."""
    if not unit.reset_urns:
        raise AleIacError(
            f"unit {unit.unit} of pool '{stack}' names no resource to recreate (its stack predates resets: "
            f"run pulumi up -s {stack} once)"
        )
    _recreator(stack).submit(unit.unit, list(unit.reset_urns))
    return _unit_of(_engine(), stack, unit.unit)


def _unit_of(engine: Engine, stack: str, name: str) -> UnitOutputs:
    units = engine.units(stack)
    if name not in units:
        raise AleIacError(f"pool stack '{stack}' no longer exports unit '{name}'")
    return units[name]


_recreators: dict[str, Batches[str, list[str], None]] = {}
_recreators_guard = threading.Lock()


def _recreator(stack: str) -> Batches[str, list[str], None]:
    """One pool stack's recreations in this process (``batches.Batches``): one ``pulumi up`` at a time, the
    requests of other units that came meanwhile together in the next one."""
    with _recreators_guard:
        if stack not in _recreators:
            _recreators[stack] = Batches(functools.partial(_replace_batch, stack))
        return _recreators[stack]


def _replace_batch(stack: str, batch: dict[str, list[str]]) -> dict[str, None]:
    replace(stack, sorted({urn for urns in batch.values() for urn in urns}))
    return {}


def replace_args(stack: str, urns: list[str]) -> list[str]:
    """The CLI arguments of one recreation: ``pulumi up --replace URN --target URN`` per resource."""
    args = ["up", "--yes", "--skip-preview", "--non-interactive", "--stack", stack]
    for urn in urns:
        args += ["--replace", urn, "--target", urn]
    return args


def replace(stack: str, urns: list[str], engine: Engine | None = None) -> None:
    """Run ``pulumi up --replace --target`` of ``urns`` on ``stack`` with the pool's program (its project's
    ``Pulumi.yaml`` and stack config), logged to the stack's log like every engine operation."""
    engine = engine or _engine()
    project = pool_project(stack)
    lock_dir = leases.lock_dir(stack)
    lock_dir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + RECREATE_LOCK_WAIT_S
    # Host-local first (other runs of this home queue here); the stack's own lock keeps other hosts out.
    with FileLock(str(lock_dir / ".recreate.lock"), timeout=RECREATE_LOCK_WAIT_S):
        while True:
            try:
                engine.run_in_project(stack, project, replace_args(stack, urns), "up --replace")
                return
            except StackLockedError as exc:
                if time.monotonic() > deadline:
                    raise StackLockedError(
                        f"pool stack '{stack}' stayed locked for {RECREATE_LOCK_WAIT_S:.0f} s ({exc})"
                    ) from None
                time.sleep(_LOCK_POLL_S)
