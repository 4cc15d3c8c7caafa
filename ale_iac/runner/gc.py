"""``ale-iac gc``: find what crashed runs left behind and destroy it.

* first, files of the Pulumi file backend that a kill tore (an empty ``.attrs`` sidecar, a leftover temp
  file, an unreadable checkpoint), which fail every ``pulumi stack ls``: each is repaired or put in the
  quarantine (``ale_iac.filebackend``), so that what follows can read the backend;
* ephemeral ``run-*`` stacks of this home that no live run claims (the run was killed, even with
  SIGKILL) — not the ones a run retained on purpose, nor other homes' (a shared backend);
* units of the host substrates (``ale_iac.substrates.registry``) whose stack is gone or no longer lists
  them (a create killed before Pulumi recorded it), and what a substrate made that no unit owns any more:
  ``docker`` networks and volumes of units whose container is gone, ``qemu`` runner containers and
  saved-state boots whose saver was killed;
* cloud units whose ``expires_at`` has passed are listed (their cloud-side TTL reaps the VMs; the
  stack record is destroyed with ``--expired``);
* work dirs of dead processes and registry files of finished runs;
* containers of the ``docker`` executor made by this home whose runner process is gone (a runner
  killed before it could remove them), when a Docker engine answers.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ale_iac import filebackend
from ale_iac.bridges.warm import sweep_stale as sweep_stale_bridges
from ale_iac.contract import UnitOutputs
from ale_iac.engine import Engine, sweep_orphan_providers
from ale_iac.errors import AleIacError
from ale_iac.files import sweep_private_dirs
from ale_iac.provision import destroy_stack, made_here
from ale_iac.runner import leases
from ale_iac.runner.run_claims import read_claims, runs_dir
from ale_iac.sandbox.portforward import sweep_orphans as sweep_forward_orphans
from ale_iac.substrates import egress, registry

KUBERNETES = "kubernetes"
"""The provider kind whose units gc finds by label on their clusters (not a host substrate)."""


@dataclass
class GcReport:
    destroyed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    sandboxes_stopped: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    providers_killed: list[int] = field(default_factory=list)
    port_forwards_killed: list[int] = field(default_factory=list)
    """kubectl port-forwards to Kubernetes units whose runner is gone (``sandbox.portforward.sweep_orphans``)."""
    warm_bridges_removed: list[str] = field(default_factory=list)
    private_dirs_removed: list[str] = field(default_factory=list)
    egress_proxies_stopped: list[str] = field(default_factory=list)
    """Egress proxies (their folders) whose runner is gone: ``substrates.egress``."""
    containers_removed: list[str] = field(default_factory=list)
    state_repairs: list[filebackend.Damage] = field(default_factory=list)
    """Damaged files of the file backend, each with what was (with ``dry_run``: would be) done about it."""


def _expired(expires_at: str | None, now: dt.datetime) -> bool:
    if not expires_at:
        return False
    try:
        when = dt.datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return False
    return when < now


def collect(
    engine: Engine,
    *,
    dry_run: bool = False,
    sandboxes: bool = False,
    expired: bool = False,
    only_stack: str | None = None,
) -> GcReport:
    report = GcReport()
    claims = read_claims()
    live = {s: c.run_id for c in claims if c.alive for s in c.stacks}
    retained = {s: c.run_id for c in claims for s in c.retained}
    now = dt.datetime.now(dt.UTC)
    if not dry_run:
        # First: the plugin of a killed CLI may still be creating a sandbox that the sweeps below would miss.
        report.providers_killed = sweep_orphan_providers()

    # Before the stacks go: a dead run's port-forward ends by itself once its pod is deleted, and one swept after
    # the destroy may or may not be there yet (the count raced).
    report.port_forwards_killed = sweep_forward_orphans(dry_run=dry_run)
    repairable = _repair_state(engine, dry_run, report)  # before anything reads the backend
    stacks = list(dict.fromkeys([s.name for s in engine.list_stacks()] + repairable))
    existing = set(stacks)
    read_units = _UnitsReader(engine)
    lease_records = leases.record_store(engine.backend_url)
    if only_stack is not None and only_stack not in existing:
        raise AleIacError(f"no stack named '{only_stack}'")
    for name in stacks:
        if only_stack is not None and name != only_stack:
            continue
        why_kept = _why_kept(name, live, retained, sandboxes, named=only_stack == name)
        if why_kept is not None:
            report.kept[name] = why_kept
            if _check_expiry(engine, read_units(name), name, now, report, destroy=expired and not dry_run):
                existing.discard(name)
            continue
        if dry_run:
            report.destroyed.append(name)
            continue
        try:
            destroy_stack(engine, name)
            report.destroyed.append(name)
            existing.discard(name)
            leases.forget_stack(name, lease_records)  # a run's shared stack had some
        except AleIacError as exc:
            report.errors.append(f"{name}: {exc}")

    _collect_substrate_units(engine, read_units, existing, set(live), dry_run, report)
    collect_containers(dry_run=dry_run, report=report)
    report.warm_bridges_removed = [str(folder) for folder in sweep_stale_bridges(dry_run=dry_run)]
    report.private_dirs_removed = [str(folder) for folder in sweep_private_dirs(dry_run=dry_run)]
    _collect_egress_proxies(dry_run, report)
    if not dry_run:
        engine.sweep_work_dirs()
        for claim in claims:
            if not claim.alive and not claim.retained:
                (runs_dir() / f"{claim.run_id}.json").unlink(missing_ok=True)
    return report


def _why_kept(name: str, live: dict[str, str], retained: dict[str, str], sandboxes: bool, named: bool) -> str | None:
    """Why gc leaves the stack alone, or None for an orphan to destroy (``sandboxes``: this home's ``sbx-*``
    too; ``named``: the stack ``--stack`` names, whatever made it)."""
    if name in live:
        return f"in use by live run {live[name]}"
    if name in retained:
        return f"retained by run {retained[name]}"
    if made_here(name, "run") or named or (sandboxes and made_here(name, "sbx")):
        return None
    if name.startswith(("run-", "sbx-")) and not made_here(name, "sbx"):
        return "made by another ale-iac home (gc only removes what this home made)"
    return "not ephemeral (pool or sandbox; use --sandboxes for sbx-*)"


def _repair_state(engine: Engine, dry_run: bool, report: GcReport) -> list[str]:
    """Repair the damaged files of a file backend (writes torn by a kill) before anything reads it; a dry
    run lists them with what it would do. Returns the stacks a dry run's repair would make readable
    (the CLI cannot list them yet)."""
    found = engine.scan_state()
    if found is None:
        return []
    if dry_run:
        report.state_repairs = list(found.damage)
        return found.repairable
    report.state_repairs, errors = filebackend.repair(found, filebackend.quarantine_folder(engine.home))
    report.errors += [f"repairing the state: {error}" for error in errors]
    return []


class _UnitsReader:
    """Each stack's unit handles, read once per gc pass (every read is a CLI call); None if unreadable."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.cache: dict[str, dict[str, UnitOutputs] | None] = {}

    def __call__(self, stack: str) -> dict[str, UnitOutputs] | None:
        if stack not in self.cache:
            try:
                self.cache[stack] = self.engine.units(stack)
            except AleIacError:
                self.cache[stack] = None
        return self.cache[stack]


def _check_expiry(
    engine: Engine, units: dict[str, UnitOutputs] | None, stack: str, now: dt.datetime, report: GcReport, destroy: bool
) -> bool:
    """Record the stack if a unit's expiry has passed; with ``destroy``, destroy it. True if destroyed."""
    if units is None or not any(u.managed and _expired(u.expires_at, now) for u in units.values()):
        return False
    report.expired.append(stack)
    if not destroy:
        return False
    try:
        destroy_stack(engine, stack)
    except AleIacError as exc:
        report.errors.append(f"{stack}: {exc}")
        return False
    report.destroyed.append(stack)
    return True


def _accounted_for(
    engine: Engine, read_units: _UnitsReader, existing: set[str], live: set[str]
) -> tuple[dict[str, set[str]], set[str]]:
    """The resource ids that stacks list, by provider kind, and the stacks to leave alone: claimed by a live
    run, being changed right now (locked by a live CLI), or unreadable."""
    referenced: dict[str, set[str]] = {}
    busy: set[str] = set(live)
    for stack in existing:
        if engine.is_locked(stack):
            busy.add(stack)
            continue
        units = read_units(stack)
        if units is None:
            busy.add(stack)
            continue
        for unit in units.values():
            referenced.setdefault(unit.provider, set()).add(unit.resource_id)
    return referenced, busy


def _collect_substrate_units(
    engine: Engine, read_units: _UnitsReader, existing: set[str], live: set[str], dry_run: bool, report: GcReport
) -> None:
    """Destroy the units of every host substrate that no stack lists (a create killed before Pulumi recorded
    it, a stack removed behind ale-iac's back), then what the substrates made that no unit owns any more. A
    unit of a stack that a live run claims, or that a live CLI is changing, may be mid-create: left alone."""
    referenced, busy = _accounted_for(engine, read_units, existing, live)
    _collect_kube_objects(existing, referenced.get(KUBERNETES, set()), busy, dry_run, report)
    for substrate in registry.all_substrates():
        listed = referenced.get(substrate.name, set())
        for unit in substrate.units():
            if unit.sandbox_id in listed or unit.stack in busy:
                continue
            destroy = functools.partial(substrate.destroy, unit.sandbox_id, None)
            what = f"{substrate.name} unit {unit.sandbox_id}"
            _remove(destroy, what, unit.sandbox_id, report.sandboxes_stopped, dry_run, report)
        for left in substrate.leftovers():
            done = report.containers_removed if left.kind == "container" else report.sandboxes_stopped
            _remove(left.remove, left.what, left.name, done, dry_run, report)


def _collect_kube_objects(
    existing: set[str], referenced: set[str], busy: set[str], dry_run: bool, report: GcReport
) -> None:
    """Delete the Kubernetes objects of this home that no stack accounts for (``runner/kube_gc.py``)."""
    from ale_iac.runner import kube_gc

    for obj in kube_gc.sweep(existing, referenced, busy, report.errors):
        _remove(functools.partial(kube_gc.delete, obj), obj.what, obj.what, report.sandboxes_stopped, dry_run, report)


def _collect_egress_proxies(dry_run: bool, report: GcReport) -> None:
    """Stop the egress proxies whose runner is gone (each recorded in its folder: ``substrates.egress``)."""
    for folder in egress.leftovers():
        remove = functools.partial(egress.sweep, folder)
        _remove(remove, f"egress proxy {folder}", str(folder), report.egress_proxies_stopped, dry_run, report)


def _remove(
    remove: Callable[[], object], what: str, name: str, done: list[str], dry_run: bool, report: GcReport
) -> None:
    """Run ``remove`` (unless ``dry_run``) and list ``name`` in ``done``; a failure goes to the report's errors."""
    if not dry_run:
        try:
            remove()
        except Exception as exc:
            report.errors.append(f"{what}: {exc}")
            return
    done.append(name)


def collect_containers(*, dry_run: bool, report: GcReport) -> None:
    """Remove this home's ``docker`` executor containers whose runner is gone. A container records its
    runner as a pid and that pid's start time (labels), so a recycled pid is not taken for it; while
    the runner lives, its containers are its own to remove. Without an engine there is nothing to do."""
    from ale_iac.docker_engine import client as docker_client
    from ale_iac.executors import docker as docker_executor

    try:
        client = docker_client(timeout=30)
    except AleIacError:
        return
    try:
        for container in docker_executor.containers_of_this_home(client):
            if container.owner_alive:
                continue
            remove = functools.partial(docker_executor.remove_container, client, container.id)
            what = f"container {container.name}"
            _remove(remove, what, container.name, report.containers_removed, dry_run, report)
    finally:
        client.close()


def destroy_retained(engine: Engine, run_id: str) -> list[str]:
    """``ale-iac sandbox destroy --run RUN_ID``: destroy every stack the run retained, then forget the
    run. Returns the stacks destroyed (a stack already gone is skipped)."""
    claim = next((c for c in read_claims() if c.run_id == run_id), None)
    if claim is None:
        raise AleIacError(f"no run {run_id!r} in {runs_dir()} (a run is listed there while it runs or retains stacks)")
    if claim.alive:
        raise AleIacError(f"run {run_id} is still running (pid {claim.pid})")
    destroyed = [stack for stack in claim.retained if destroy_stack(engine, stack)]
    (runs_dir() / f"{run_id}.json").unlink(missing_ok=True)
    return destroyed
