"""Shared by the tests of ale_iac.llm: plans, tool lists shaped like the real CLIs', SDK clients."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai

from ale_iac.llm.plan import Plan, plan_from

RUN_COMMAND_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}

CLAUDE_TOOLS: list[dict[str, Any]] = [
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {
            "type": "object",
            "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "number"},
                "description": {"type": "string"},
                "run_in_background": {"type": "boolean"},
                "dangerouslyDisableSandbox": {"type": "boolean"},
            },
            "required": ["command"],
        },
    },
    {
        "name": "mcp__vm__run_command",
        "description": "Run a command in the sandbox.",
        "input_schema": RUN_COMMAND_SCHEMA,
    },
]
"""What Claude Code 2.1.332 offers with ``--tools Bash`` and the vm bridge (ENABLE_TOOL_SEARCH=false)."""

CODEX_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}, "tty": {"type": "boolean"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
    },
    {
        "type": "namespace",
        "name": "mcp__vm",
        "description": "Tools in the mcp__vm namespace.",
        "tools": [{"type": "function", "name": "run_command", "strict": False, "parameters": RUN_COMMAND_SCHEMA}],
    },
    {"type": "web_search", "external_web_access": False},
]
"""The shape of what Codex 0.171.0 offers (an unknown model name, the vm bridge mounted), trimmed."""

CODEX_PREAMBLE: list[dict[str, Any]] = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
]


def plan(*scripts: tuple[str, list[dict[str, Any]]]) -> Plan:
    return plan_from({"scripts": [{"match": match, "turns": turns} for match, turns in scripts]})


TWO_STEP = plan(
    (
        "list the files",
        [
            {
                "tool": "mcp:vm.run_command",
                "arguments": {"command": "ls"},
                "usage": {"input_tokens": 11, "output_tokens": 3},
            },
            {
                "tool": "shell",
                "arguments": {"command": "pwd", "timeout": 5},
                "usage": {"input_tokens": 13, "output_tokens": 4},
            },
            {"text": "Two files.", "usage": {"input_tokens": 17, "output_tokens": 5}},
        ],
    ),
    ("fail with 500", [{"fail": "http_500"}]),
    ("hang", [{"fail": "hang"}]),
    ("drop", [{"fail": "drop"}]),
)
"""turn 0: an MCP tool; turn 1: the native shell; turn 2: the answer; and one script per failure."""


def claude_messages(prompt: str, results: int = 0) -> list[dict[str, Any]]:
    """A Claude Code conversation: the prompt (with a system entry, as Claude Code sends), then
    ``results`` tool calls each with its result."""
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                {"type": "text", "text": prompt},
            ],
        },
        {"role": "system", "content": "environment: linux"},
    ]
    for i in range(results):
        messages.append(
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "Bash", "input": {}}]}
        )
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": "ok"}]})
    return messages


def codex_input(prompt: str, results: int = 0) -> list[dict[str, Any]]:
    """A Codex conversation: developer and environment messages, the prompt, then ``results`` tool calls
    each with its output (a string, or a list of input_text parts, as Codex sends both)."""
    items: list[dict[str, Any]] = [
        *CODEX_PREAMBLE,
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]},
    ]
    for i in range(results):
        items.append({"type": "function_call", "call_id": f"c{i}", "name": "exec_command", "arguments": "{}"})
        output: Any = (
            "Output:\nok"
            if i % 2 == 0
            else [{"type": "input_text", "text": "Output:"}, {"type": "input_text", "text": "ok"}]
        )
        items.append({"type": "function_call_output", "call_id": f"c{i}", "output": output})
    return items


def anthropic_client(base_url: str, api_key: str, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, **kwargs)


def openai_client(base_url: str, api_key: str, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, **kwargs)


def unix_client(path: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=path), base_url="http://gateway")
