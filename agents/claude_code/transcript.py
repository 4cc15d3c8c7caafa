"""Claude Code's ``--output-format stream-json --verbose`` transcript, read into an ATIF trajectory.

Pure functions, no I/O: the deployer reads the log through its executor and writes the images this
returns. The log is the CLI's stdout and stderr in one file, so lines that are not JSON events
(stderr notices) are kept aside as the log's tail, for errors.

Events (Claude Code 2.1.332): ``system/init`` (tools, MCP servers and their status), ``assistant``
(one per content block: text, thinking or tool_use; its ``usage`` is a placeholder),
``user`` (tool results, paired with their call by ``tool_use_id``), ``system/api_retry``,
``system/permission_denied``, and a final ``result`` (``is_error``, ``terminal_reason``,
``api_error_status``, ``usage``, ``modelUsage``, ``total_cost_usd``). ``result.subtype`` says
``success`` even for API errors, so it is not read.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from ale_iac.agent import AgentInfo, Step, TokenMetrics, Trajectory, TrajectoryBuilder, json_lines

TAIL_LINES = 12
_IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp", "image/gif": "gif"}


@dataclass
class Transcript:
    """A log split into the CLI's JSON events and its other lines."""

    events: list[dict[str, Any]]
    other_lines: list[str]

    @property
    def init(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("type") == "system" and e.get("subtype") == "init"), None)

    @property
    def result(self) -> dict[str, Any] | None:
        return next((e for e in reversed(self.events) if e.get("type") == "result"), None)

    def tail(self, lines: int = TAIL_LINES) -> str:
        kept = [line for line in self.other_lines if line.strip()]
        return "\n".join(kept[-lines:])


def read_transcript(text: str) -> Transcript:
    return Transcript(*json_lines(text))


def failed_servers(transcript: Transcript) -> list[str]:
    """MCP servers the CLI could not start (``init.mcp_servers[].status`` other than connected)."""
    init = transcript.init or {}
    return [
        f"{server.get('name')} ({server.get('status')})"
        for server in init.get("mcp_servers") or []
        if isinstance(server, dict) and server.get("status") != "connected"
    ]


def run_error(transcript: Transcript, exit_code: int | None) -> str | None:
    """Why the run failed, or None when it completed: exit 0, a final result that is not an error,
    and every MCP server connected."""
    result = transcript.result
    if result is None:
        where = "before writing a transcript" if not transcript.events else "without a final result"
        tail = transcript.tail()
        return f"the CLI exited {exit_code} {where}" + (f": {tail}" if tail else "")
    if result.get("is_error"):
        reason = result.get("terminal_reason") or result.get("subtype") or "error"
        status = result.get("api_error_status")
        detail = result.get("result") or "; ".join(str(e) for e in result.get("errors") or []) or "no detail"
        return f"{reason}{f' (HTTP {status})' if status else ''}: {detail}"
    failed = failed_servers(transcript)
    if failed:
        return f"MCP server(s) failed to start: {', '.join(failed)}"
    if exit_code != 0:
        return f"the CLI exited {exit_code}" + (f": {transcript.tail()}" if transcript.tail() else "")
    return None


@dataclass
class Parsed:
    trajectory: Trajectory
    images: dict[str, bytes] = field(default_factory=dict)
    """Work-dir-relative path -> bytes of each image a tool returned (screenshots)."""


def _text_of(content: Any, images: list[tuple[str, bytes]]) -> str:
    """A tool result's text; image blocks are collected into ``images`` (media type, bytes)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif block.get("type") == "image":
            source = block.get("source") or {}
            try:
                data = base64.b64decode(source.get("data", ""), validate=True)
            except (binascii.Error, ValueError):
                parts.append("[image: not valid base64]")
                continue
            images.append((str(source.get("media_type", "image/png")), data))
        else:
            parts.append(json.dumps(block))
    return "\n".join(parts)


def _usage_metrics(result: dict[str, Any]) -> TokenMetrics:
    usage = result.get("usage")
    if isinstance(usage, dict):
        fresh = int(usage.get("input_tokens") or 0)
        cache_read = int(usage.get("cache_read_input_tokens") or 0)
        cache_write = int(usage.get("cache_creation_input_tokens") or 0)
        output = int(usage.get("output_tokens") or 0)
    else:  # older or partial results: add up the per-model usage
        per_model = [m for m in (result.get("modelUsage") or {}).values() if isinstance(m, dict)]
        if not per_model:
            return {}
        fresh = sum(int(m.get("inputTokens") or 0) for m in per_model)
        cache_read = sum(int(m.get("cacheReadInputTokens") or 0) for m in per_model)
        cache_write = sum(int(m.get("cacheCreationInputTokens") or 0) for m in per_model)
        output = sum(int(m.get("outputTokens") or 0) for m in per_model)
    cost = result.get("total_cost_usd")
    return {
        # Anthropic's input_tokens excludes cached tokens; ATIF's prompt tokens include them
        "total_prompt_tokens": fresh + cache_read + cache_write,
        "total_completion_tokens": output,
        "total_cached_tokens": cache_read,
        "total_cost_usd": float(cost) if isinstance(cost, int | float) else None,
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
    init = transcript.init or {}
    session = str(init.get("session_id") or session_id)
    version = init.get("claude_code_version")
    info = AgentInfo(
        name=agent.name,
        version=str(version) if version else agent.version,
        model_name=str(init.get("model") or agent.model_name or "") or None,
    )
    builder = TrajectoryBuilder(session, info)
    images: dict[str, bytes] = {}
    if prompt is not None:
        first = next((e["timestamp"] for e in transcript.events if isinstance(e.get("timestamp"), str)), None)
        asked = builder.add("user", prompt)
        if first:  # the prompt went in just before the first event
            asked.timestamp = first
    pending: dict[str, Step] = {}  # tool_use id -> its step
    texts: list[tuple[str, str, str | None]] = []  # (message id, text, timestamp) not yet placed
    last_system = ""

    def system(message: str, **extra: Any) -> None:
        nonlocal last_system
        if message != last_system:
            builder.add("system", message, **extra)
            last_system = message

    def flush_texts(keep_for: str | None = None) -> str:
        """Emit the buffered text blocks as agent steps, except those of message ``keep_for``: their
        text is returned, to become the message of that message's tool call step."""
        kept = []
        for mid, body, stamp in texts:
            if keep_for is not None and mid == keep_for:
                kept.append(body)
                continue
            step = builder.add("agent", body)
            if stamp:
                step.timestamp = stamp
        texts.clear()
        return "\n".join(kept)

    for failed in failed_servers(transcript):
        system(f"MCP server {failed} did not start: its tools are missing")

    for event in transcript.events:
        kind = event.get("type")
        stamp = event.get("timestamp") if isinstance(event.get("timestamp"), str) else None
        extra: dict[str, Any] = {}
        if event.get("parent_tool_use_id"):
            extra["parent_tool_use_id"] = event["parent_tool_use_id"]
        if kind == "assistant":
            message = event.get("message") or {}
            mid = str(message.get("id", ""))
            if event.get("is_api_error_message") or message.get("model") == "<synthetic>":
                flush_texts()
                body = _text_of(message.get("content"), [])
                status_code = event.get("api_error_status")
                system(body or "API error", **({"api_error_status": status_code} if status_code else {}))
                continue
            for block in message.get("content") or []:
                if not isinstance(block, dict):
                    continue
                block_type = block.get("type")
                if block_type == "text":
                    texts.append((mid, str(block.get("text", "")), stamp))
                elif block_type == "thinking":
                    flush_texts()
                    step = builder.add("agent", "", reasoning=str(block.get("thinking", "")), **extra)
                    if stamp:
                        step.timestamp = stamp
                elif block_type == "tool_use":
                    said = flush_texts(keep_for=mid)
                    call_id = str(block.get("id") or f"call_{len(pending) + 1}")
                    given = block.get("input")
                    arguments: dict[str, Any] = given if isinstance(given, dict) else {}
                    step = builder.add_tool_call(
                        str(block.get("name", "?")),
                        arguments,
                        "(no result: the run ended before the tool returned)",
                        is_error=True,
                        message=said,
                        call_id=call_id,
                    )
                    if extra:
                        step.extra = extra
                    if stamp:
                        step.timestamp = stamp
                    pending[call_id] = step
        elif kind == "user":
            flush_texts()
            content = (event.get("message") or {}).get("content")
            for block in content if isinstance(content, list) else []:
                if not isinstance(block, dict) or block.get("type") != "tool_result":
                    continue
                call = pending.get(str(block.get("tool_use_id")))
                if call is None or call.observation is None:
                    continue
                found: list[tuple[str, bytes]] = []
                observed = call.observation.results[0]
                observed.content = _text_of(block.get("content"), found)
                observed.is_error = bool(block.get("is_error"))
                saved = []
                for number, (media_type, data) in enumerate(found, start=1):
                    suffix = f"-{number}" if len(found) > 1 else ""
                    ext = _IMAGE_EXTENSIONS.get(media_type, "bin")
                    rel = f"{image_dir}/step-{call.step_id}{suffix}.{ext}"
                    images[rel] = data
                    saved.append(rel)
                if saved:
                    observed.extra = {"screenshots": saved}
                    if not observed.content:
                        observed.content = f"[{len(saved)} image(s)]"
        elif kind == "system":
            subtype = event.get("subtype")
            if subtype == "api_retry":
                flush_texts()
                system(
                    f"API retry {event.get('attempt')}/{event.get('max_retries')} "
                    f"(HTTP {event.get('error_status')}): {event.get('error')}"
                )
            elif subtype == "permission_denied":
                flush_texts()
                system(f"permission denied: {json.dumps({k: v for k, v in event.items() if k != 'type'})}")
        elif kind == "result":
            flush_texts()
            if event.get("is_error"):
                reason = event.get("terminal_reason") or "error"
                detail = event.get("result") or "; ".join(str(e) for e in event.get("errors") or [])
                system(str(detail or reason), terminal_reason=reason, api_error_status=event.get("api_error_status"))
    flush_texts()

    result = transcript.result
    if result is None:
        if status == "timeout":
            system(f"the run was stopped: {error or 'timeout'}")
        elif not transcript.events:
            tail = transcript.tail()
            system(f"the CLI exited {exit_code} before writing a transcript" + (f": {tail}" if tail else ""))
        else:
            tail = transcript.tail()
            system(f"the CLI exited {exit_code} without a final result" + (f": {tail}" if tail else ""))
    elif status != "completed" and error and not result.get("is_error"):
        system(error)
    metrics: TokenMetrics = _usage_metrics(result) if result else {}
    extra_info: dict[str, Any] = {"status": status, "exit_code": exit_code}
    if error:
        extra_info["error"] = error
    if result:
        extra_info.update(
            {k: result.get(k) for k in ("terminal_reason", "num_turns", "duration_ms", "stop_reason") if k in result}
        )
        if isinstance(result.get("result"), str):
            extra_info["final_answer"] = result["result"]
    if init:
        extra_info["tools"] = init.get("tools")
        extra_info["mcp_servers"] = init.get("mcp_servers")
    return Parsed(builder.build(extra=extra_info, **metrics), images)
