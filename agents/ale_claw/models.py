"""Model adapters over the official SDKs: Anthropic Messages (``anthropic``) and OpenAI Responses
(``openai``), both async, non-streaming, with the SDKs' own retries off (``max_retries=0``): the loop
retries itself, so that both APIs back off the same way and every attempt is in the trajectory.

An adapter renders a context view (``context.ViewTurn``) in its API's shape, sends it and returns a
:class:`ModelReply` with the token usage the API reported, normalised: ``prompt_tokens`` counts every
input token (cached ones included), ``cached_tokens`` those read from the cache. A failure is a
:class:`ModelCallError` that says whether it is worth retrying.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import anthropic
import openai

from ale_iac.agent_sdk import ModelAccess

if TYPE_CHECKING:  # annotations only: the deployer loads the sibling modules by file
    from agents.ale_claw.context import ViewTurn

RETRYABLE_STATUSES: Final = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
"""Statuses worth another try: timeouts, conflicts, rate limits (429), server errors, Anthropic's
overloaded (529). Anything else (400 bad request, 401/403 credentials, 404, 413, 422) ends the run."""


@dataclass(frozen=True)
class ToolDef:
    name: str
    description: str
    schema: dict[str, Any]


@dataclass
class ModelReply:
    text: str
    calls: list[tuple[str, str, dict[str, Any]]]
    """(call id, tool name, arguments) of each tool call, in order."""
    usage: dict[str, int]
    stop_reason: str | None
    response_id: str | None
    latency_s: float
    raw: list[dict[str, Any]] | None = None
    raw_usage: dict[str, Any] = field(default_factory=dict)


class ModelCallError(Exception):
    def __init__(self, message: str, *, status: int | None, retryable: bool, retry_after_s: float | None = None):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class Adapter(Protocol):
    api: str

    async def complete(
        self, system: str, view: list[ViewTurn], tools: list[ToolDef], max_tokens: int
    ) -> ModelReply: ...

    async def close(self) -> None: ...


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    try:
        value = headers.get("retry-after") if headers is not None else None
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _status_error(exc: Exception, status: int, body: object, headers: Mapping[str, str]) -> ModelCallError:
    detail = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(detail, dict):
        detail = f"{detail.get('type', '')}: {detail.get('message', '')}".strip(": ")
    retryable = status in RETRYABLE_STATUSES or status >= 500
    return ModelCallError(
        f"HTTP {status}: {detail or exc}", status=status, retryable=retryable, retry_after_s=_retry_after(headers)
    )


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {"_invalid_arguments": str(raw)}
    return value if isinstance(value, dict) else {"_invalid_arguments": str(raw)}


class AnthropicAdapter:
    api = "anthropic"

    def __init__(self, access: ModelAccess, timeout_s: float) -> None:
        self.model = access.model
        self.client = anthropic.AsyncAnthropic(
            base_url=access.base_url, api_key=access.api_key, max_retries=0, timeout=timeout_s
        )

    def messages(self, view: list[ViewTurn]) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for turn in view:
            if turn.role == "user":
                messages.append({"role": "user", "content": [{"type": "text", "text": turn.text}]})
            elif turn.role == "assistant":
                blocks: list[dict[str, Any]] = [{"type": "text", "text": turn.text}] if turn.text else []
                blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in turn.calls]
                messages.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "(no text)"}]})
            else:
                results = []
                for r in turn.results:
                    content: list[dict[str, Any]] = [{"type": "text", "text": r.text or "(no output)"}]
                    content += [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": i.media_type,
                                "data": base64.b64encode(i.data).decode(),
                            },
                        }
                        for i in r.images
                    ]
                    results.append(
                        {"type": "tool_result", "tool_use_id": r.call_id, "content": content, "is_error": r.is_error}
                    )
                messages.append({"role": "user", "content": results})
        if messages and isinstance(messages[-1]["content"], list) and messages[-1]["content"]:
            messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}  # cache the prefix up to here
        return messages

    async def complete(self, system: str, view: list[ViewTurn], tools: list[ToolDef], max_tokens: int) -> ModelReply:
        start = time.monotonic()
        try:
            response = await self.client.messages.create(
                model=self.model,
                max_tokens=max_tokens,
                system=system,
                # plain JSON dicts where the SDK declares TypedDict unions: the same shape, not provably so
                messages=self.messages(view),  # type: ignore[arg-type]
                tools=[{"name": t.name, "description": t.description, "input_schema": t.schema} for t in tools],
            )
        except anthropic.APIStatusError as exc:
            raise _status_error(exc, exc.status_code, exc.body, exc.response.headers) from exc
        except anthropic.APIConnectionError as exc:
            raise ModelCallError(f"connection failed: {exc}", status=None, retryable=True) from exc
        except anthropic.AnthropicError as exc:
            raise ModelCallError(f"{type(exc).__name__}: {exc}", status=None, retryable=False) from exc
        texts, calls = [], []
        for block in response.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append((block.id, block.name, _arguments(block.input)))
        u = response.usage
        cached = int(getattr(u, "cache_read_input_tokens", 0) or 0)
        created = int(getattr(u, "cache_creation_input_tokens", 0) or 0)
        return ModelReply(
            text="\n".join(texts),
            calls=calls,
            usage={
                "prompt_tokens": int(u.input_tokens) + cached + created,
                "completion_tokens": int(u.output_tokens),
                "cached_tokens": cached,
            },
            stop_reason=response.stop_reason,
            response_id=response.id,
            latency_s=time.monotonic() - start,
            raw_usage=u.model_dump(exclude_none=True),
        )

    async def close(self) -> None:
        await self.client.close()


class OpenAIAdapter:
    api = "openai"

    def __init__(self, access: ModelAccess, timeout_s: float) -> None:
        self.model = access.model
        self.client = openai.AsyncOpenAI(
            base_url=access.base_url, api_key=access.api_key, max_retries=0, timeout=timeout_s
        )

    def items(self, view: list[ViewTurn]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for turn in view:
            if turn.role == "user":
                items.append(
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": turn.text}]}
                )
            elif turn.role == "assistant":
                if turn.raw is not None and turn.text != "[elided to fit the context]":
                    items.extend(turn.raw)
                    continue
                if turn.text:
                    items.append(
                        {
                            "type": "message",
                            "role": "assistant",
                            "content": [{"type": "output_text", "text": turn.text}],
                        }
                    )
                items += [
                    {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": json.dumps(c.arguments)}
                    for c in turn.calls
                ]
            else:
                for r in turn.results:
                    text = ("ERROR: " if r.is_error else "") + (r.text or "(no output)")
                    output: str | list[dict[str, Any]] = text
                    if r.images:
                        output = [{"type": "input_text", "text": text}] + [
                            {
                                "type": "input_image",
                                "image_url": f"data:{i.media_type};base64,{base64.b64encode(i.data).decode()}",
                                "detail": "auto",
                            }
                            for i in r.images
                        ]
                    items.append({"type": "function_call_output", "call_id": r.call_id, "output": output})
        return items

    async def complete(self, system: str, view: list[ViewTurn], tools: list[ToolDef], max_tokens: int) -> ModelReply:
        start = time.monotonic()
        try:
            response = await self.client.responses.create(
                model=self.model,
                instructions=system,
                # plain JSON dicts where the SDK declares TypedDict unions: the same shape, not provably so
                input=self.items(view),  # type: ignore[arg-type]
                tools=[
                    {
                        "type": "function",
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.schema,
                        "strict": False,
                    }
                    for t in tools
                ],
                max_output_tokens=max_tokens,
            )
        except openai.APIStatusError as exc:
            raise _status_error(exc, exc.status_code, exc.body, exc.response.headers) from exc
        except openai.APIConnectionError as exc:
            raise ModelCallError(f"connection failed: {exc}", status=None, retryable=True) from exc
        except openai.OpenAIError as exc:
            raise ModelCallError(f"{type(exc).__name__}: {exc}", status=None, retryable=False) from exc
        texts, calls, raw = [], [], []
        for item in response.output:
            raw.append(item.model_dump(exclude_none=True, mode="json"))
            if item.type == "message":
                texts += [part.text for part in item.content if part.type == "output_text"]
            elif item.type == "function_call":
                calls.append((item.call_id, item.name, _arguments(item.arguments)))
        u = response.usage
        cached = int(u.input_tokens_details.cached_tokens or 0) if u and u.input_tokens_details else 0
        return ModelReply(
            text="\n".join(texts),
            calls=calls,
            usage={
                "prompt_tokens": int(u.input_tokens) if u else 0,
                "completion_tokens": int(u.output_tokens) if u else 0,
                "cached_tokens": cached,
            },
            stop_reason=response.status,
            response_id=response.id,
            latency_s=time.monotonic() - start,
            raw=raw,
            raw_usage=u.model_dump(exclude_none=True) if u else {},
        )

    async def close(self) -> None:
        await self.client.close()


def make_adapter(access: ModelAccess, timeout_s: float) -> Adapter:
    if access.api == "anthropic":
        return AnthropicAdapter(access, timeout_s)
    return OpenAIAdapter(access, timeout_s)
