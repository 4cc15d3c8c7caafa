"""The harness's own log and its ATIF trajectory.

The log (``ale_claw/events.jsonl`` in the work dir) has one JSON record per event: ``start`` (prompt,
system prompt, tools, model), ``model`` (one model turn: text, tool calls, usage as the API reported
it, stop reason, latency, the context view's statistics, the failed attempts before it), ``tool`` (one
tool call's result: text, is_error, screenshot files, the bridge calls it made, restarts), ``model_error``
(a failed attempt: status, retryable, the back-off), and ``end`` (status, error). ``to_trajectory``
turns it into the trajectory: a system step, the user's prompt, then one agent step per model turn
with its tool calls and their results as the observation.
"""

from __future__ import annotations

from typing import Any

from ale_iac.agent_sdk import AgentInfo, Step, Trajectory, TrajectoryBuilder


def to_trajectory(
    records: list[dict[str, Any]], *, agent: AgentInfo, session_id: str, status: str, error: str | None
) -> Trajectory:
    start = next((r for r in records if r.get("type") == "start"), {})
    end: dict[str, Any] = next((r for r in reversed(records) if r.get("type") == "end"), {})
    builder = TrajectoryBuilder(session_id=str(start.get("session_id") or session_id), agent=agent)
    if start:
        system = builder.add("system", str(start.get("system", "")), tools=start.get("tools"))
        system.timestamp = str(start.get("t") or system.timestamp)
        user = builder.add("user", str(start.get("prompt", "")))
        user.timestamp = str(start.get("t") or user.timestamp)
    results: dict[str, dict[str, Any]] = {str(r.get("call_id")): r for r in records if r.get("type") == "tool"}
    totals = {"prompt": 0, "completion": 0, "cached": 0}
    for turn in (r for r in records if r.get("type") == "model"):
        usage = dict(turn.get("usage") or {})
        totals["prompt"] += int(usage.get("prompt_tokens", 0))
        totals["completion"] += int(usage.get("completion_tokens", 0))
        totals["cached"] += int(usage.get("cached_tokens", 0))
        calls = list(turn.get("calls") or [])
        observations = []
        for call in calls:
            result = results.get(str(call["id"]))
            if result is None:  # cut before the tool ran (cancelled, wall time)
                observations.append(
                    {"source_call_id": call["id"], "content": "(no result: the run ended)", "is_error": True}
                )
                continue
            extra: dict[str, Any] = {k: result[k] for k in ("duration_s", "bridge_calls", "output") if result.get(k)}
            if result.get("screenshots"):
                extra["screenshots"] = result["screenshots"]
            observations.append(
                {
                    "source_call_id": call["id"],
                    "content": str(result.get("text", "")),
                    "is_error": bool(result.get("is_error")),
                    "extra": extra or None,
                }
            )
        step_extra: dict[str, Any] = {
            "usage": usage,
            "api_usage": turn.get("api_usage"),
            "stop_reason": turn.get("stop_reason"),
            "response_id": turn.get("response_id"),
            "latency_s": turn.get("latency_s"),
            "context": turn.get("context"),
        }
        if turn.get("failed_attempts"):
            step_extra["failed_attempts"] = turn["failed_attempts"]
        step = Step.model_validate(
            {
                "step_id": len(builder.steps) + 1,
                "timestamp": str(turn.get("t")),
                "source": "agent",
                "message": str(turn.get("text", "")),
                "tool_calls": [
                    {"tool_call_id": c["id"], "function_name": c["name"], "arguments": c.get("arguments") or {}}
                    for c in calls
                ]
                or None,
                "observation": {"results": observations} if observations else None,
                "extra": {k: v for k, v in step_extra.items() if v is not None},
            }
        )
        builder.steps.append(step)
    failed_last = [r for r in records if r.get("type") == "model_error" and r.get("final")]
    final_status = str(end.get("status") or status)
    final_error = end.get("error") or error
    if failed_last or final_status != "completed":
        builder.add(
            "system",
            f"run ended: {final_status}" + (f": {final_error}" if final_error else ""),
            model_errors=[{k: r.get(k) for k in ("status", "message", "retryable", "attempt")} for r in failed_last]
            or None,
        )
    model_turns = sum(1 for r in records if r.get("type") == "model")
    notes = f"ale-claw: {final_status}" + (f" ({final_error})" if final_error else "")
    return builder.build(
        notes=notes,
        extra={
            "status": final_status,
            "error": final_error,
            "model_turns": model_turns,
            "model_errors": sum(1 for r in records if r.get("type") == "model_error"),
            "bridge_restarts": end.get("bridge_restarts"),
            "raw_log": start.get("raw_log"),
        },
        total_prompt_tokens=totals["prompt"],
        total_completion_tokens=totals["completion"],
        total_cached_tokens=totals["cached"],
    )
