"""ATIF-compatible trajectories."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ale_iac.agent_sdk.trajectory import SCHEMA_VERSION, AgentInfo, Trajectory, TrajectoryBuilder


def test_builder_numbers_steps_and_links_observations() -> None:
    builder = TrajectoryBuilder("s1", AgentInfo(name="a"))
    builder.add("user", "do it")
    builder.add_tool_call("run_command", {"command": "true"}, '{"exit_code": 0}')
    builder.add_tool_call("click", {"coordinate": [1, 2]}, "boom", is_error=True)
    trajectory = builder.build()
    data = trajectory.model_dump(mode="json", exclude_none=True)
    assert data["schema_version"] == SCHEMA_VERSION
    assert [s["step_id"] for s in data["steps"]] == [1, 2, 3]
    call = data["steps"][1]["tool_calls"][0]
    assert data["steps"][1]["observation"]["results"][0]["source_call_id"] == call["tool_call_id"]
    assert data["final_metrics"] == {"total_steps": 3, "total_tool_calls": 2, "total_errors": 1}
    assert Trajectory.model_validate(data) == trajectory


def test_out_of_order_steps_are_rejected() -> None:
    with pytest.raises(ValidationError, match="step ids must be 1, 2, 3"):
        Trajectory.model_validate(
            {"session_id": "s", "agent": {"name": "a"}, "steps": [{"step_id": 2, "source": "user"}]}
        )
