"""Codex's ``codex exec --json`` transcript, read into an ATIF trajectory.

Pure functions, no I/O: the deployer reads the log through its executor and writes the images this
returns. The log is the CLI's stdout and stderr in one file, so lines that are not JSON events
(stderr notices such as ``Reading additional input from stdin...``) are kept aside as the log's
tail, for errors.

Events (Codex 0.171.0): ``thread.started`` (the session id), ``turn.started``, ``item.started`` and
``item.completed`` (items ``agent_message``, ``reasoning``, ``mcp_tool_call``, ``command_execution``,
``file_change``, ``web_search``, ``todo_list``, ``error``), ``error`` (retry notices), and per turn
``turn.completed`` (``usage``) or ``turn.failed`` (``error.message``). A tool call is paired with
its result by the item's id, which both of its events carry.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from ale_iac.agent import AgentInfo, Step, TokenMetrics, Trajectory, TrajectoryBuilder, json_lines

TAIL_LINES = 12
NO_RESULT = "(no result: the run ended before the tool returned)"
_IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}
_TOOL_ITEMS = {"mcp_tool_call", "command_execution", "file_change", "web_search"}


@dataclass
class Transcript:
    """A log split into the CLI's JSON events and its other lines."""

    events: list[dict[str, Any]]
    other_lines: list[str]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    def tail(self, lines: int = TAIL_LINES) -> str:
        kept = [line for line in self.other_lines if line.strip()]
        return "\n".join(kept[-lines:])


def read_transcript(text: str) -> Transcript:
    return Transcript(*json_lines(text))


def _failure(event: dict[str, Any]) -> str:
    error = event.get("error")
    message = error.get("message") if isinstance(error, dict) else error
    return str(message or "turn failed")


def run_error(transcript: Transcript, exit_code: int | None) -> str | None:
    """Why the run failed, or None when it completed: exit 0, a completed turn and no failed one."""
    failed = transcript.of_type("turn.failed")
    if failed:
        return f"turn failed: {_failure(failed[-1])}"
    if not transcript.of_type("turn.completed"):
        where = "before writing a transcript" if not transcript.events else "without completing a turn"
        tail = transcript.tail()
        return f"the CLI exited {exit_code} {where}" + (f": {tail}" if tail else "")
    if exit_code != 0:
        tail = transcript.tail()
        return f"the CLI exited {exit_code}" + (f": {tail}" if tail else "")
    return None


@dataclass
class Parsed:
    trajectory: Trajectory
    images: dict[str, bytes] = field(default_factory=dict)
    """Work-dir-relative path -> bytes of each image a tool returned (screenshots)."""


def _mcp_text(result: Any, images: list[tuple[str, bytes]]) -> str:
    """An MCP result's text blocks; image blocks are collected into ``images``."""
    if not isinstance(result, dict):
        return ""
    parts: list[str] = []
    for block in result.get("content") or []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "image":
            try:
                data = base64.b64decode(str(block.get("data", "")), validate=True)
            except (binascii.Error, ValueError):
                parts.append("[image: not valid base64]")
                continue
            images.append((str(block.get("mimeType") or block.get("mime_type") or "image/png"), data))
        else:
            parts.append(json.dumps(block))
    if not parts and result.get("structured_content") is not None:
        parts.append(json.dumps(result["structured_content"]))
    return "\n".join(parts)


def _call(item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The tool name and arguments of a tool item, named as the model called it."""
    kind = item.get("type")
    if kind == "mcp_tool_call":
        arguments = item.get("arguments")
        return f"mcp__{item.get('server')}__{item.get('tool')}", arguments if isinstance(arguments, dict) else {}
    if kind == "command_execution":
        return "exec_command", {"command": item.get("command", "")}  # as run: `/bin/bash -lc '<cmd>'`
    if kind == "file_change":
        return "apply_patch", {"changes": item.get("changes", [])}
    if kind == "web_search":
        return "web_search", {"query": item.get("query", "")}
    return str(kind), {}


def _outcome(item: dict[str, Any], images: list[tuple[str, bytes]]) -> tuple[str, bool]:
    """A completed tool item's result text and whether it is an error."""
    kind = item.get("type")
    status = item.get("status")
    if kind == "mcp_tool_call":
        error = item.get("error")
        result = item.get("result")
        text = _mcp_text(result, images)
        is_error = status == "failed" or bool(error) or bool(isinstance(result, dict) and result.get("is_error"))
        if error:
            message = error.get("message") if isinstance(error, dict) else error
            text = f"{text}\n{message}".strip() if text else str(message)
        return text, is_error
    if kind == "command_execution":
        code = item.get("exit_code")
        text = str(item.get("aggregated_output") or "")
        return f"{text}\n[exit code {code}]" if code is not None else text, status == "failed" or code not in (0, None)
    if kind == "file_change":
        return json.dumps(item.get("changes", [])), status == "failed"
    return json.dumps({k: v for k, v in item.items() if k not in ("id", "type")}), status == "failed"


def _usage_metrics(events: list[dict[str, Any]]) -> TokenMetrics:
    usages = [e["usage"] for e in events if e.get("type") == "turn.completed" and isinstance(e.get("usage"), dict)]
    if not usages:
        return {}
    return {
        # OpenAI's input_tokens include the cached ones; output_tokens include reasoning
        "total_prompt_tokens": sum(int(u.get("input_tokens") or 0) for u in usages),
        "total_completion_tokens": sum(int(u.get("output_tokens") or 0) for u in usages),
        "total_cached_tokens": sum(int(u.get("cached_input_tokens") or 0) for u in usages),
    }


def to_trajectory(
    text: str,
    *,
    prompt: str | None,
    agent: AgentInfo,
    session_id: str,
    status: str,
    exit_code: int | None = None,
    error: str | None = None,
    image_dir: str = "screenshots",
) -> Parsed:
    """The trajectory of one run from its log ``text``; ``status``/``exit_code``/``error`` are the
    run's result (a run stopped from outside, say on a timeout, has no word of it in its log)."""
    transcript = read_transcript(text)
    started = transcript.of_type("thread.started")
    session = str(started[0].get("thread_id") or session_id) if started else session_id
    builder = TrajectoryBuilder(session, agent)
    images: dict[str, bytes] = {}
    if prompt is not None:
        builder.add("user", prompt)
    open_calls: dict[str, Step] = {}  # item id -> its step, until its item.completed
    last_system = ""

    def system(message: str, **extra: Any) -> None:
        nonlocal last_system
        if message != last_system:
            builder.add("system", message, **extra)
            last_system = message

    def start_call(item: dict[str, Any]) -> Step:
        name, arguments = _call(item)
        item_id = str(item.get("id") or f"item_{len(open_calls)}")
        step = builder.add_tool_call(name, arguments, NO_RESULT, is_error=True, call_id=item_id)
        open_calls[item_id] = step
        return step

    for event in transcript.events:
        kind = event.get("type")
        given = event.get("item")
        item: dict[str, Any] = given if isinstance(given, dict) else {}
        item_type = item.get("type")
        if kind == "item.started" and item_type in _TOOL_ITEMS:
            start_call(item)
        elif kind == "item.completed":
            if item_type in _TOOL_ITEMS:
                step = open_calls.pop(str(item.get("id")), None) or start_call(item)
                open_calls.pop(str(item.get("id")), None)
                found: list[tuple[str, bytes]] = []
                content, is_error = _outcome(item, found)
                if step.observation is None:  # add_tool_call always makes one
                    continue
                result = step.observation.results[0]
                result.content, result.is_error = content, is_error
                saved = []
                for number, (media_type, data) in enumerate(found, start=1):
                    suffix = f"-{number}" if len(found) > 1 else ""
                    rel = f"{image_dir}/step-{step.step_id}{suffix}.{_IMAGE_EXTENSIONS.get(media_type, 'bin')}"
                    images[rel] = data
                    saved.append(rel)
                if saved:
                    result.extra = {"screenshots": saved}
                    if not result.content:
                        result.content = f"[{len(saved)} image(s)]"
            elif item_type == "agent_message":
                builder.add("agent", str(item.get("text", "")))
            elif item_type == "reasoning":
                builder.add("agent", "", reasoning=str(item.get("text", "")))
            elif item_type == "todo_list":
                builder.add("agent", "", plan=item.get("items", []))
            elif item_type == "error":
                system(f"codex: {item.get('message', '')}", level="warning")
        elif kind == "error":
            system(f"codex: {event.get('message', '')}")
        elif kind == "turn.failed":
            system(f"turn failed: {_failure(event)}")

    if not transcript.of_type("turn.completed") and not transcript.of_type("turn.failed"):
        tail = transcript.tail()
        if status == "timeout":
            system(f"the run was stopped: {error or 'timeout'}")
        elif not transcript.events:
            system(f"the CLI exited {exit_code} before writing a transcript" + (f": {tail}" if tail else ""))
        else:
            system(f"the CLI exited {exit_code} without completing a turn" + (f": {tail}" if tail else ""))
    elif status != "completed" and error and not transcript.of_type("turn.failed"):
        system(error)
    extra_info: dict[str, Any] = {"status": status, "exit_code": exit_code}
    if error:
        extra_info["error"] = error
    answers = [s.message for s in builder.steps if s.source == "agent" and s.message and not s.tool_calls]
    if answers and transcript.of_type("turn.completed"):
        extra_info["final_answer"] = answers[-1]
    return Parsed(builder.build(extra=extra_info, **_usage_metrics(transcript.events)), images)
