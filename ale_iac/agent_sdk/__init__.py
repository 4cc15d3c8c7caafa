"""The agent SDK: everything a deployer under ``agents/`` imports, and nothing else of ale-iac.

A deployer says *what* to do to run an agent; an executor decides *where*. Write a
:class:`BaseAgentDeployer` subclass (``install``, ``launch``, ``parse_artifacts``) that does all its
I/O through ``self.executor`` (a :class:`BaseExecutor`), and turn the agent's native logs into a
:class:`Trajectory` with :class:`TrajectoryBuilder`.
"""

from ale_iac.agent_sdk.config import (
    AgentConfig,
    AgentRunResult,
    AgentStatus,
    BridgeKind,
    ModelApi,
    ModelConfig,
    TaskPaths,
    ToolCatalog,
)
from ale_iac.agent_sdk.deployer import BaseAgentDeployer, load_deployer_class, sibling_module
from ale_iac.agent_sdk.executor import (
    BaseExecutor,
    BridgeLaunch,
    CliInstall,
    ModelAccess,
    ModelGrant,
    ProcessResult,
)
from ale_iac.agent_sdk.executor_registry import available_executors, make_executor
from ale_iac.agent_sdk.trajectory import (
    AgentInfo,
    Step,
    TokenMetrics,
    Trajectory,
    TrajectoryBuilder,
    UnreadableEvent,
    json_lines,
    read_events,
)

__all__ = [
    "AgentConfig",
    "AgentInfo",
    "AgentRunResult",
    "AgentStatus",
    "BaseAgentDeployer",
    "BaseExecutor",
    "BridgeKind",
    "BridgeLaunch",
    "CliInstall",
    "ModelAccess",
    "ModelApi",
    "ModelConfig",
    "ModelGrant",
    "ProcessResult",
    "Step",
    "TaskPaths",
    "TokenMetrics",
    "ToolCatalog",
    "Trajectory",
    "TrajectoryBuilder",
    "UnreadableEvent",
    "available_executors",
    "json_lines",
    "load_deployer_class",
    "make_executor",
    "read_events",
    "sibling_module",
]
