"""Executor implementations: where a deployer runs. The base class and the registry of kinds are
part of the agent SDK (``ale_iac.agent_sdk``).

* ``local``: in the runner's own process on this host.
"""
