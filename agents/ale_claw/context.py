"""The conversation, kept outside the sandbox in a neutral shape, and the context policy that decides
what of it the model sees on each request.

The history is never rewritten: every request renders a *view* of it. Every turn stays in the view
(both APIs need each tool call paired with its result), but what a turn carries shrinks with age:

1. screenshots: the newest ``keep_screenshots`` at full size, the next ``downscale_screenshots`` at
   half size (Pillow), older ones dropped (a placeholder names the file they were saved as);
2. tool outputs: in the last ``recent_turns`` tool turns as the tool returned them (already paged),
   older ones cut to ``old_output_chars`` (head and tail, with a marker);
3. if the estimate still exceeds the budget (``context_limit_tokens`` minus the reply's ``max_tokens``,
   times ``budget_fraction``), older turns are elided outright, oldest first, until it fits; a view that
   cannot fit even so raises :class:`ContextFullError`.

Tokens are estimated (4 characters a token; an image ``width * height / 750``, Anthropic's rule); the
API's own count of the previous request is recorded next to the estimate in the trajectory.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field, replace
from typing import Any, Literal

CHARS_PER_TOKEN = 4
ELIDED = "[elided to fit the context]"


class ContextFullError(Exception):
    """Even with everything old elided, the conversation does not fit the model's context."""


@dataclass
class Shot:
    """A screenshot in the conversation; ``path`` is the file it was saved as (work-dir relative)."""

    data: bytes
    media_type: str
    path: str
    small: bytes | None = None


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class Result:
    call_id: str
    name: str
    text: str
    is_error: bool
    shots: list[Shot] = field(default_factory=list)


@dataclass
class Turn:
    role: Literal["user", "assistant", "tool"]
    text: str = ""
    calls: list[Call] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    raw: list[dict[str, Any]] | None = None
    """The API's own output items for an assistant turn (Responses: replayed as they came)."""


@dataclass(frozen=True)
class Image:
    data: bytes
    media_type: str


@dataclass(frozen=True)
class ViewResult:
    call_id: str
    name: str
    text: str
    is_error: bool
    images: tuple[Image, ...]


@dataclass(frozen=True)
class ViewTurn:
    role: Literal["user", "assistant", "tool"]
    text: str
    calls: tuple[Call, ...]
    results: tuple[ViewResult, ...]
    raw: list[dict[str, Any]] | None


@dataclass(frozen=True)
class Policy:
    context_limit_tokens: int
    max_tokens: int
    budget_fraction: float
    keep_screenshots: int
    downscale_screenshots: int
    recent_turns: int
    old_output_chars: int


@dataclass(frozen=True)
class ViewStats:
    estimated_tokens: int
    screenshots_full: int
    screenshots_downscaled: int
    screenshots_dropped: int
    outputs_truncated: int
    turns_elided: int

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}


def png_size(data: bytes) -> tuple[int, int] | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    return None


def image_tokens(data: bytes) -> int:
    size = png_size(data)
    return max(1, size[0] * size[1] // 750) if size else 1600


def downscale(shot: Shot) -> bytes | None:
    """The shot at half size, as PNG (made once); None when Pillow cannot read it."""
    if shot.small is None:
        try:
            from PIL import Image as PILImage

            with PILImage.open(io.BytesIO(shot.data)) as img:
                half = img.resize((max(1, img.width // 2), max(1, img.height // 2)))
                out = io.BytesIO()
                half.save(out, format="PNG", optimize=False)
                shot.small = out.getvalue()
        except Exception:
            return None
    return shot.small


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-(limit // 3) :]
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters of an old output dropped ...]\n{tail}"


def _estimate(turns: list[ViewTurn], fixed_chars: int) -> int:
    chars = fixed_chars
    images = 0
    for turn in turns:
        chars += len(turn.text)
        for call in turn.calls:
            chars += len(call.name) + len(str(call.arguments))
        for result in turn.results:
            chars += len(result.text)
            images += sum(image_tokens(i.data) for i in result.images)
    return chars // CHARS_PER_TOKEN + images


def _view_result(
    result: Result, full: set[int], small_ids: set[int], cut: bool, policy: Policy, counts: dict[str, int]
) -> ViewResult:
    """One tool result as the model sees it: each screenshot whole, downscaled or dropped (a note says where
    it is saved), an old output cut to ``policy.old_output_chars``; ``counts`` tallies what was done."""
    images: list[Image] = []
    notes: list[str] = []
    for shot in result.shots:
        small = downscale(shot) if id(shot) in small_ids else None
        if id(shot) in full:
            images.append(Image(shot.data, shot.media_type))
            counts["full"] += 1
        elif small is not None:
            images.append(Image(small, "image/png"))
            counts["small"] += 1
        else:
            notes.append(f"[old screenshot dropped from the context; saved as {shot.path}]")
            counts["dropped"] += 1
    text = result.text
    if cut and len(text) > policy.old_output_chars:
        text = _cut(text, policy.old_output_chars)
        counts["truncated"] += 1
    text = "\n".join([text, *notes]) if notes else text
    return ViewResult(result.call_id, result.name, text, result.is_error, tuple(images))


def _elide(view: list[ViewTurn], budget: int, fixed_chars: int) -> tuple[int, int]:
    """Elide turns of ``view`` in place, oldest first, until it fits ``budget``: never the first user turn (the
    task) nor the latest two turns. Returns the estimate after, and how many turns were elided."""
    elided = 0
    estimate = _estimate(view, fixed_chars)
    for index in range(1, max(1, len(view) - 2)):
        if estimate <= budget:
            break
        shown = view[index]
        if shown.role == "user":
            continue
        shrunk = replace(
            shown,
            text=ELIDED if shown.text else "",
            results=tuple(replace(r, text=ELIDED, images=()) for r in shown.results),
        )
        if shrunk != shown:
            view[index] = shrunk
            elided += 1
            estimate = _estimate(view, fixed_chars)
    return estimate, elided


def render(history: list[Turn], policy: Policy, fixed_chars: int = 0) -> tuple[list[ViewTurn], ViewStats]:
    """The view of ``history`` the model gets (``fixed_chars``: system prompt and tool specs)."""
    tool_turns = [i for i, t in enumerate(history) if t.role == "tool"]
    recent = set(tool_turns[-policy.recent_turns :]) if policy.recent_turns > 0 else set()
    # screenshots, newest first
    shots_order = [s for t in reversed(history) for r in reversed(t.results) for s in reversed(r.shots)]
    full = {id(s) for s in shots_order[: policy.keep_screenshots]}
    small_ids = {
        id(s) for s in shots_order[policy.keep_screenshots : policy.keep_screenshots + policy.downscale_screenshots]
    }
    counts = {"full": 0, "small": 0, "dropped": 0, "truncated": 0}
    view: list[ViewTurn] = []
    for index, turn in enumerate(history):
        cut = index not in recent and turn.role == "tool"
        results = [_view_result(result, full, small_ids, cut, policy, counts) for result in turn.results]
        view.append(ViewTurn(turn.role, turn.text, tuple(turn.calls), tuple(results), turn.raw))
    budget = int((policy.context_limit_tokens - policy.max_tokens) * policy.budget_fraction)
    estimate, elided = _elide(view, budget, fixed_chars)
    if estimate > budget:
        raise ContextFullError(
            f"the conversation needs about {estimate} tokens even with old turns elided; the budget is {budget} "
            f"({policy.context_limit_tokens} context - {policy.max_tokens} reply) x {policy.budget_fraction}"
        )
    stats = ViewStats(estimate, counts["full"], counts["small"], counts["dropped"], counts["truncated"], elided)
    return view, stats
