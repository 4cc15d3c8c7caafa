"""Kept for stacks made before one provider served every host substrate (``ale_iac.infra.host_units``).

Such a stack's state holds its provider dill-pickled by reference as
``ale_iac.infra.docker.DockerSandboxProvider``, and the engine unpickles it to refresh or delete the unit: this
class must keep that path. It binds the substrate, which those units' properties do not record. New units
pickle ``HostUnitProvider`` itself.
"""

from __future__ import annotations

from typing import ClassVar

from ale_iac.infra.host_units import HostUnitProvider


class DockerSandboxProvider(HostUnitProvider):
    substrate_name: ClassVar[str | None] = "docker"
