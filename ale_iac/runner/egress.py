"""A unit's egress under its route's policy (narrowed by its task card's), as the lifecycle uses it: opened
once the unit is ready, closed before its cleanup, every attempt in the unit's record (``egress.jsonl``) and
a summary in ``run.json`` (``egress``). A refused attempt is no error of the run; a task whose setup fails
while the proxy refused something gets an error that names what was refused."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ale_iac.egress_policy import EgressPolicy
from ale_iac.errors import AleIacError, one_line
from ale_iac.profile import Profile
from ale_iac.substrates import registry
from ale_iac.substrates.egress import UnitEgress, summarize

if TYPE_CHECKING:
    from ale_iac.contract import UnitOutputs
    from ale_iac.runner.records import UnitRecord
    from ale_iac.runner.tasks import TaskCard
    from ale_iac.sandbox.handle import SandboxHandle

EGRESS_LOG = "egress.jsonl"


class EgressRefusedError(AleIacError):
    """A task's own step failed while its unit's egress proxy refused destinations (named in the message)."""


def policy_for(profile: Profile, card: TaskCard) -> EgressPolicy | None:
    """The policy of the route that serves ``card``, narrowed by the card's own ``egress`` (ValueError when it
    would widen it, or when the route has none to narrow). A route carries a policy only where its units' endpoint
    is an ale-iac forwarder (host routes; ``guest_agent: true``, ``forwarder: true``: the route models refuse the
    rest), so any route's policy is carried: :func:`open_egress` checks the unit's own outputs."""
    _, route = profile.route(card.snapshot)
    policy = getattr(route, "egress", None)
    if card.egress is None:
        return policy if isinstance(policy, EgressPolicy) else None
    if not isinstance(policy, EgressPolicy):
        raise ValueError("the task narrows an egress policy, but its route has none (it reaches no network)")
    return policy.narrowed_by(card.egress)


def leased_policy(unit: UnitOutputs, card: TaskCard) -> EgressPolicy | None:
    """A pool unit's policy: its route's as the pool stack exported it (its outputs' ``egress``), narrowed by
    ``card``'s as :func:`policy_for` narrows an ephemeral unit's (ValueError likewise)."""
    policy = EgressPolicy.model_validate(unit.egress) if unit.egress is not None else None
    if card.egress is None:
        return policy
    if policy is None:
        raise ValueError(
            f"the task narrows an egress policy, but pool unit {unit.unit} has none (it reaches no network)"
        )
    return policy.narrowed_by(card.egress)


async def open_egress(handle: SandboxHandle, policy: EgressPolicy) -> UnitEgress:
    """The unit's proxy and channel (its endpoint must be an ale-iac forwarder: its outputs carry the channel)."""
    registry.require_channel(handle, f"unit {handle.unit} has an egress policy")
    token = handle.token()
    if token is None:
        raise AleIacError(f"unit {handle.unit} has no endpoint token: its egress channel cannot be opened")
    egress = UnitEgress(handle.endpoint, token, policy)
    await egress.start()
    return egress


async def close_egress(egress: UnitEgress, record: UnitRecord) -> dict[str, Any]:
    """Stop the unit's proxy; its attempts go to the record (``egress.jsonl``, ``run.json``'s ``egress``)."""
    attempts = await egress.stop()
    lines = "".join(json.dumps(dataclasses.asdict(a), separators=(",", ":")) + "\n" for a in attempts)
    (record.folder / EGRESS_LOG).write_text(lines, encoding="utf-8")
    up, down = egress.channel_bytes
    summary = {
        "policy": egress.policy.summary(),
        **summarize(attempts),
        "channel_bytes_out": up,
        "channel_bytes_in": down,
    }
    record.write_run(egress=summary)
    record.event("egress", **{k: v for k, v in summary.items() if k != "refused_destinations"})
    return summary


@contextlib.contextmanager
def blame_refusals(egress: UnitEgress | None) -> Iterator[None]:
    """Around a task's own step: if it fails while the proxy refused something, say what was refused."""
    since = time.time()
    try:
        yield
    except Exception as exc:
        refused = [] if egress is None else [a for a in egress.attempts() if not a.allowed and a.time >= since - 1]
        if not refused:
            raise
        named = ", ".join(sorted({f"{a.host}:{a.port} ({a.reason})" for a in refused}))
        raise EgressRefusedError(f"{one_line(exc)}; meanwhile the egress policy refused {named}") from exc
