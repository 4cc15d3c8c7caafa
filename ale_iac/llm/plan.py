"""The scripted model server's plan: which answers to give, turn by turn, to which prompt.

```yaml
scripts:
  - match: "write .* to the file"       # a regex searched in the prompt (the first user turn's text)
    turns:
      - tool: mcp:vm.run_command          # an MCP tool: mcp:<server>.<tool>
        arguments: {command: "echo hi > /tmp/out.txt"}
        usage: {input_tokens: 1200, output_tokens: 40}
      - tool: shell                       # the CLI's own shell tool (Claude Code Bash, Codex exec_command)
        arguments: {command: "cat /tmp/out.txt"}
      - tool: fn:exec                     # a function tool offered under exactly this name (a harness's own tool)
        arguments: {command: "ls"}
      - text: "Done."                     # the final answer
  - match: "."
    turns:
      - fail: http_429                    # http_500/429/529/400/401, hang (never completes), drop (cut mid-stream)
        times: 2                          # optional: only the first 2 requests reaching it fail, then it is skipped
```

The first script whose ``match`` is found wins. The turn served is the number of tool results already
in the conversation (so the server keeps no state, and concurrent conversations work).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag

from ale_iac.config_files import read_yaml, validate

FailMode = Literal["http_500", "http_429", "http_529", "http_400", "http_401", "hang", "drop"]
SHELL: Final = "shell"
MCP_TOOL = re.compile(r"^mcp:(?P<server>[A-Za-z0-9_-]+)\.(?P<tool>[A-Za-z0-9_.-]+)$")
FN_TOOL = re.compile(r"^fn:(?P<name>[A-Za-z0-9_-]+)$")

_TOOL_TAG: Final = "tool turn"
_TEXT_TAG: Final = "text turn"
_FAIL_TAG: Final = "fail turn"
TURN_TAGS: Final = frozenset({_TOOL_TAG, _TEXT_TAG, _FAIL_TAG})
"""Tags pydantic puts in error locations for the turn union; hidden from error messages."""


class Usage(BaseModel):
    """Token counts reported for one turn."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


DEFAULT_USAGE: Final = Usage(input_tokens=100, output_tokens=20)
NO_USAGE: Final = Usage(input_tokens=0, output_tokens=0)


def _logical_name(value: str) -> str:
    if value != SHELL and not MCP_TOOL.match(value) and not FN_TOOL.match(value):
        raise ValueError(
            f"{value!r} is not a tool: use mcp:<server>.<tool> (e.g. mcp:vm.run_command), fn:<name> or shell"
        )
    return value


class ToolTurn(BaseModel):
    """Call a tool: ``mcp:<server>.<tool>``, ``fn:<name>`` (a function tool offered under exactly that
    name, as an agent harness names its own tools) or ``shell`` (the CLI's native shell; needs ``command``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: Annotated[str, AfterValidator(_logical_name)]
    arguments: dict[str, Any] = Field(default_factory=dict)
    usage: Usage = DEFAULT_USAGE

    def mcp_parts(self) -> tuple[str, str]:
        """(server, tool) of an ``mcp:`` tool."""
        found = MCP_TOOL.match(self.tool)
        if found is None:
            raise ValueError(f"{self.tool} is not an MCP tool")
        return found["server"], found["tool"]

    def function_name(self) -> str | None:
        """The name of an ``fn:`` tool (None for the other forms)."""
        found = FN_TOOL.match(self.tool)
        return found["name"] if found else None


def _shell_has_command(turn: ToolTurn) -> ToolTurn:
    if turn.tool == SHELL and not isinstance(turn.arguments.get("command"), str):
        raise ValueError("the shell tool needs arguments.command, a string")
    return turn


class TextTurn(BaseModel):
    """Answer with text and end the conversation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    usage: Usage = DEFAULT_USAGE


class FailTurn(BaseModel):
    """Fail: ``http_<status>`` (a vendor-shaped error response with that status: 500, 429, 529, 400,
    401), ``hang`` (a stream that starts and never completes), ``drop`` (a stream cut off mid-way).
    Serves no usage. With ``times: N`` only the first N requests that reach the turn (counted by the
    server, across conversations) fail; after that the turn is skipped, as if it were not in the script."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fail: FailMode
    times: int | None = Field(default=None, ge=1)

    @property
    def http_status(self) -> int | None:
        """The status of an ``http_<status>`` failure."""
        return int(self.fail.removeprefix("http_")) if self.fail.startswith("http_") else None


def _turn_kind(value: Any) -> str | None:
    if isinstance(value, BaseModel):
        return {ToolTurn: _TOOL_TAG, TextTurn: _TEXT_TAG, FailTurn: _FAIL_TAG}.get(type(value))
    if isinstance(value, dict):
        present = [tag for key, tag in (("tool", _TOOL_TAG), ("text", _TEXT_TAG), ("fail", _FAIL_TAG)) if key in value]
        return present[0] if len(present) == 1 else None
    return None


Turn = Annotated[
    Annotated[ToolTurn, AfterValidator(_shell_has_command), Tag(_TOOL_TAG)]
    | Annotated[TextTurn, Tag(_TEXT_TAG)]
    | Annotated[FailTurn, Tag(_FAIL_TAG)],
    Discriminator(
        _turn_kind,
        custom_error_type="turn_kind",
        custom_error_message="a turn has exactly one of: tool, text, fail",
    ),
]


def _compiles(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None
    return value


class Script(BaseModel):
    """The turns served to conversations whose prompt matches ``match``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    match: Annotated[str, AfterValidator(_compiles)] = Field(
        description="A regular expression searched (re.search) in the prompt; inline flags work."
    )
    turns: list[Turn] = Field(min_length=1)

    def matches(self, prompt: str) -> bool:
        return re.search(self.match, prompt) is not None


class Plan(BaseModel):
    """A scripted model server's plan: the first script whose ``match`` is found in the prompt is used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scripts: list[Script] = Field(min_length=1)

    def script_for(self, prompt: str) -> int | None:
        """The index of the first script matching ``prompt``."""
        return next((i for i, script in enumerate(self.scripts) if script.matches(prompt)), None)


def plan_from(data: Any, source: str | Path = "<plan>") -> Plan:
    """A plan from parsed YAML/JSON data; errors name ``source`` and the field."""
    return validate(Plan, data, source, drop=TURN_TAGS)


def load_plan(path: Path) -> Plan:
    """A plan from a YAML file; errors name the file and the field."""
    return plan_from(read_yaml(path), path)
