"""What the scripted model server reads of a request, in either wire API: the prompt, the task's text, how many
tool results the conversation already holds (the turn to answer), and the tools it offers."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["anthropic", "openai"]


@dataclass(frozen=True)
class Offered:
    """The tools a request offers, keyed by (namespace or None, name), with their argument names."""

    params: dict[tuple[str | None, str], frozenset[str] | None]
    display: tuple[str, ...]

    def has(self, namespace: str | None, name: str) -> bool:
        return (namespace, name) in self.params


def _texts(content: Any) -> Iterator[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]


def prompt_of(api: Api, body: dict[str, Any]) -> str:
    """The prompt a plan is matched against: the text of the user messages before the first answer.

    Claude Code puts the prompt in its first user message (after ``<system-reminder>`` blocks); Codex
    sends an ``<environment_context>`` user message first and the prompt in a second one."""
    items = body.get("messages") if api == "anthropic" else body.get("input")
    if isinstance(items, str):
        return items
    texts: list[str] = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        role = item.get("role")
        if item.get("type", "message") != "message" or role == "assistant":
            break
        if role == "user":
            texts.extend(_texts(item.get("content")))
    return "\n".join(texts)


_WRAPPER_BLOCK = re.compile(r"\A\s*<([A-Za-z_][\w-]*)\b[^>]*?(?:/>|>.*?</\1\s*>)", re.S)
"""A block a CLI wraps its own context in (``<system-reminder>...</system-reminder>``,
``<environment_context/>``), at the start of a text."""


def task_text_of(api: Api, body: dict[str, Any]) -> str:
    """The task's own words in the prompt: the last user text before the first answer, without the
    blocks the CLI wraps its own context in (Claude Code's ``<system-reminder>``, Codex's
    ``<environment_context>``); the whole prompt if nothing else is left."""
    items = body.get("messages") if api == "anthropic" else body.get("input")
    if isinstance(items, str):
        return items
    last = ""
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type", "message") != "message" or item.get("role") == "assistant":
            break
        if item.get("role") != "user":
            continue
        for text in _texts(item.get("content")):
            rest = text
            while found := _WRAPPER_BLOCK.match(rest):
                rest = rest[found.end() :]
            last = rest.strip() or last
    return last or prompt_of(api, body)


def tool_results_in(api: Api, body: dict[str, Any]) -> int:
    """How many tool results the conversation holds: the index of the turn to serve."""
    if api == "anthropic":
        return sum(
            1
            for message in body.get("messages") or []
            if isinstance(message, dict) and isinstance(message.get("content"), list)
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"
        )
    items = body.get("input")
    if not isinstance(items, list):
        return 0
    return sum(1 for item in items if isinstance(item, dict) and str(item.get("type", "")).endswith("_output"))


def _properties(schema: Any) -> frozenset[str] | None:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return frozenset(props) if isinstance(props, dict) else None


def offered_tools(api: Api, body: dict[str, Any]) -> Offered:
    params: dict[tuple[str | None, str], frozenset[str] | None] = {}
    display: list[str] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if api == "anthropic":
            name = tool.get("name")
            if isinstance(name, str):
                params[(None, name)] = _properties(tool.get("input_schema"))
                display.append(name)
        elif tool.get("type") == "namespace":
            namespace = str(tool.get("name"))
            for child in tool.get("tools") or []:
                if isinstance(child, dict) and isinstance(child.get("name"), str):
                    params[(namespace, child["name"])] = _properties(child.get("parameters"))
                    display.append(f"{namespace}/{child['name']}")
        elif isinstance(tool.get("name"), str):
            params[(None, tool["name"])] = _properties(tool.get("parameters"))
            display.append(tool["name"])
        else:
            display.append(f"<{tool.get('type')}>")
    return Offered(params, tuple(display))
