"""The declaring side: Pulumi programs that turn a profile and a list of units into resources.

The machinery lives in :mod:`ale_iac.infra.declaration`; its names are re-exported here lazily, so that
processes which only need a leaf module (the local sandbox supervisor imports
``ale_iac.substrates.local.supervisor``) do not pay for importing pydantic models and Pulumi.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ale_iac.infra.declaration import DeclareContext, ProviderModule, UnitSpec, declare, provider_module

__all__ = ["DeclareContext", "ProviderModule", "UnitSpec", "declare", "provider_module"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("ale_iac.infra.declaration"), name)
    raise AttributeError(f"module 'ale_iac.infra' has no attribute {name!r}")
