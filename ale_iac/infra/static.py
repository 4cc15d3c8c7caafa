"""The ``static`` provider: existing computer-server endpoints. Declares no resource at all.

Unit *i* of a stack gets endpoint *i* of the route; ale-iac never destroys what it did not create,
so the handles say ``managed: false`` and destroying the stack touches nothing outside Pulumi state. A route
with ``forwarder: true`` says its endpoints are ale-iac forwarders: their handles carry the model channel
(``gateway_channel``), which also lets their units carry an egress policy.
"""

from __future__ import annotations

from typing import Any

from ale_iac.contract import UnitSpec
from ale_iac.errors import ConfigError
from ale_iac.infra import DeclareContext
from ale_iac.profile import StaticRoute


def declare_unit(unit: UnitSpec, snapshot: str, route: StaticRoute, ctx: DeclareContext) -> dict[str, Any]:
    if ctx.index >= len(route.endpoints):
        raise ConfigError(
            f"profile {ctx.profile}",
            f"snapshots.{snapshot}.endpoints",
            f"{ctx.unit_count} units need {ctx.unit_count} endpoints, the route lists {len(route.endpoints)}",
        )
    endpoint = route.endpoints[ctx.index].rstrip("/")
    return {
        "unit": unit.name,
        "provider": "static",
        "endpoint": endpoint,
        "os": route.os,
        "snapshot": snapshot,
        "image": route.image,
        "resource_id": endpoint,
        "region": None,
        "paths": route.paths.model_dump(),
        "labels": {"stack": ctx.stack, "unit": unit.name, "profile": ctx.profile, **unit.labels},
        "expires_at": None,
        "managed": False,
        "reset": route.reset,
        "gateway_channel": channel.model_dump() if (channel := route.gateway_channel()) else None,
        **_token(route),
    }


def _token(route: StaticRoute) -> dict[str, Any]:
    """The endpoints' token (``endpoint_token_env``), as a secret output; nothing when the route has none."""
    token = route.endpoint_token()
    if token is None:
        return {}
    import pulumi

    return {"endpoint_token": pulumi.Output.secret(token)}
