"""The declaring side: Pulumi programs that turn a profile and a list of units into resources.

``declare()`` (in :mod:`ale_iac.infra.declaration`) is the entry point; one module per provider
kind declares a unit's resources. Host substrates' process drivers live in ``ale_iac.substrates``.
"""

from ale_iac.infra.declaration import DeclareContext, ProviderModule, declare, provider_module

__all__ = ["DeclareContext", "ProviderModule", "declare", "provider_module"]
