"""The agent loop: ask the model, run the tools it calls, repeat until it answers without one.

Limits: ``max_steps`` model turns and ``max_wall_s`` seconds for the whole run (status ``timeout``).
Model errors: a retryable one (429, 529, 5xx, a broken connection) is retried after an exponential
back-off (``retry_base_s * 2**n``, at most ``retry_max_s``, or the server's ``retry-after`` when it is
longer), up to ``model_retries`` times; a non-retryable one (400, 401, ...) ends the run at once, status
``failed`` with the status and the API's message. Tool errors go back to the model; the loop goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ale_iac.agent_sdk import AgentStatus, sibling_module

if TYPE_CHECKING:  # mypy reads the siblings by their path in the repository; the runner loads them by file
    from agents.ale_claw import context, models
    from agents.ale_claw.tools import Toolbox
else:
    context = sibling_module(__file__, "context")
    models = sibling_module(__file__, "models")


@dataclass(frozen=True)
class Limits:
    max_steps: int
    max_wall_s: float
    max_tokens: int
    model_retries: int
    retry_base_s: float
    retry_max_s: float


class RunEndedError(Exception):
    def __init__(self, status: AgentStatus, message: str) -> None:
        super().__init__(message)
        self.status: AgentStatus = status


class Loop:
    def __init__(
        self,
        *,
        adapter: models.Adapter,
        toolbox: Toolbox,
        policy: context.Policy,
        limits: Limits,
        system: str,
        record: Callable[..., None],
        save_shot: Callable[[bytes, str, int], str],
        flush: Callable[[], None],
    ) -> None:
        self.adapter = adapter
        self.toolbox = toolbox
        self.policy = policy
        self.limits = limits
        self.system = system
        self.record = record
        self.save_shot = save_shot
        self.flush = flush
        self.tools = [models.ToolDef(s.name, s.description, s.schema) for s in toolbox.specs()]
        self.fixed_chars = len(system) + sum(len(t.description) + len(str(t.schema)) for t in self.tools)

    async def run(self, prompt: str) -> tuple[AgentStatus, str | None, str]:
        """(status, error, the final answer)."""
        history = [context.Turn("user", prompt)]
        try:
            async with asyncio.timeout_at(asyncio.get_running_loop().time() + self.limits.max_wall_s):
                for number in range(1, self.limits.max_steps + 1):
                    answer = await self._step(history, number)
                    if answer is not None:
                        return "completed", None, answer
            return "failed", f"step limit reached: {self.limits.max_steps} model turns without a final answer", ""
        except TimeoutError:
            return "timeout", f"wall-time limit reached: {self.limits.max_wall_s:.0f} s", ""
        except RunEndedError as exc:
            return exc.status, str(exc), ""

    async def _step(self, history: list[context.Turn], number: int) -> str | None:
        try:
            view, stats = context.render(history, self.policy, self.fixed_chars)
        except context.ContextFullError as exc:
            raise RunEndedError("failed", f"context full: {exc}") from exc
        reply, failures = await self._ask(view)
        calls = [context.Call(cid, name, args) for cid, name, args in reply.calls]
        self.record(
            "model",
            n=number,
            text=reply.text,
            calls=[{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls],
            usage=reply.usage,
            api_usage=reply.raw_usage,
            stop_reason=reply.stop_reason,
            response_id=reply.response_id,
            latency_s=round(reply.latency_s, 4),
            context=stats.as_dict(),
            failed_attempts=failures or None,
        )
        history.append(context.Turn("assistant", reply.text, calls, raw=reply.raw))
        if not calls:
            self.flush()
            return str(reply.text)
        results: list[context.Result] = []
        step_id = number + 2  # the trajectory's step: system 1, prompt 2, model turn n is n + 2
        for call in calls:
            started = time.monotonic()
            if "_invalid_arguments" in call.arguments:
                outcome = self.toolbox.error(
                    f"the arguments of {call.name} are not a JSON object: {call.arguments['_invalid_arguments'][:200]}"
                )
            else:
                outcome = await self.toolbox.run(call.name, call.arguments)
            shots: list[context.Shot] = []
            for data, mime in outcome.images:
                path = self.save_shot(data, mime, step_id)
                shots.append(context.Shot(data, mime, path))
            self.record(
                "tool",
                call_id=call.id,
                name=call.name,
                text=outcome.text,
                is_error=outcome.is_error,
                screenshots=[s.path for s in shots] or None,
                duration_s=round(time.monotonic() - started, 4),
                bridge_calls=outcome.extra.get("bridge_calls"),
                output={k: v for k, v in outcome.extra.items() if k != "bridge_calls"} or None,
            )
            results.append(context.Result(call.id, call.name, outcome.text, outcome.is_error, shots))
        history.append(context.Turn("tool", results=results))
        self.flush()
        return None

    async def _ask(self, view: list[context.ViewTurn]) -> tuple[models.ModelReply, list[dict[str, Any]]]:
        failures: list[dict[str, Any]] = []
        attempt = 0
        while True:
            try:
                reply = await self.adapter.complete(self.system, view, self.tools, self.limits.max_tokens)
                return reply, failures
            except models.ModelCallError as exc:
                final = not exc.retryable or attempt >= self.limits.model_retries
                delay = 0.0 if final else self._delay(attempt, exc.retry_after_s)
                failure = {
                    "status": exc.status,
                    "message": str(exc),
                    "retryable": exc.retryable,
                    "attempt": attempt + 1,
                    "backoff_s": round(delay, 3),
                }
                failures.append(failure)
                self.record("model_error", final=final, **failure)
                if final:
                    self.flush()
                    what = f"model API error {exc.status}" if exc.status else "model API error"
                    why = "not retryable" if not exc.retryable else f"still failing after {attempt} retries"
                    raise RunEndedError("failed", f"{what} ({why}): {exc}") from exc
                await asyncio.sleep(delay)
                attempt += 1

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.limits.retry_max_s, self.limits.retry_base_s * 2**attempt)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.limits.retry_max_s))
        return float(delay)
