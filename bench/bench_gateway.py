"""Latency the model gateway adds to a model call: the same streaming call straight to the scripted
model server and through the gateway (token check, key swap, forwarding, usage metering).

    .venv/bin/python bench/bench_gateway.py [--runs 200] [--warmup 20] [--concurrency 8]

Both APIs (Anthropic Messages and OpenAI Responses), ``stream: true``, a tool-call answer of about
1 kB of SSE; one keep-alive httpx client per path; calls alternate between the two paths so drift
hits both alike. Reported per path: time to the first event and to the end of the stream (mean,
p50, p95), and the p50 overhead. Then ``--concurrency`` conversations at once, to see how the
gateway's single thread holds up: wall time for the same number of calls, direct and through it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from ale_iac.llm.gateway import ModelGateway
from ale_iac.llm.plan import plan_from
from ale_iac.llm.scripted import ScriptedModelServer

KEY = "sk-bench-real-key"
PLAN = plan_from(
    {"scripts": [{"match": "bench", "turns": [{"tool": "mcp:vm.run_command", "arguments": {"command": "true"}}]}]}
)
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}
BODIES: dict[str, dict[str, Any]] = {
    "anthropic": {
        "model": "bench",
        "max_tokens": 100,
        "stream": True,
        "messages": [{"role": "user", "content": "bench"}],
        "tools": [{"name": "mcp__vm__run_command", "description": "run", "input_schema": SCHEMA}],
    },
    "openai": {
        "model": "bench",
        "stream": True,
        "input": [{"role": "user", "content": "bench"}],
        "tools": [{"type": "namespace", "name": "mcp__vm", "tools": [{"type": "function", "name": "run_command"}]}],
    },
}

Call = Callable[[], tuple[float, float]]


def streaming_call(client: httpx.Client, url: str, headers: dict[str, str], body: dict[str, Any]) -> Call:
    def call() -> tuple[float, float]:
        started = time.perf_counter()
        first = None
        with client.stream("POST", url, headers=headers, json=body) as response:
            response.raise_for_status()
            for _ in response.iter_raw():
                if first is None:
                    first = time.perf_counter() - started
        return first or 0.0, time.perf_counter() - started

    return call


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.fmean(ms):7.2f} {statistics.median(ms):7.2f} {p95(ms):7.2f}"


def run(runs: int, warmup: int, concurrency: int) -> None:
    with ScriptedModelServer(PLAN, api_key=KEY) as server, ModelGateway() as gateway, httpx.Client() as client:
        print(f"{runs} streaming calls per path after {warmup} warm-up calls; ms (mean, p50, p95)\n")
        print(f"{'api':<10} {'path':<8} {'first event':>23}   {'whole stream':>23}")
        calls: dict[str, dict[str, Call]] = {}
        for api in ("anthropic", "openai"):
            upstream = server.base_url + ("/v1" if api == "openai" else "")
            grant = gateway.grant(api, api=api, upstream_base_url=upstream, api_key=KEY)  # type: ignore[arg-type]
            root = gateway.tcp_root + ("/v1" if api == "openai" else "")
            suffix = "/responses" if api == "openai" else "/v1/messages"
            body = BODIES[api]
            calls[api] = {
                "direct": streaming_call(
                    client, upstream + suffix, {"x-api-key": KEY, "authorization": f"Bearer {KEY}"}, body
                ),
                "gateway": streaming_call(client, root + suffix, {"x-api-key": grant.token}, body),
            }
            for _ in range(warmup):
                calls[api]["direct"]()
                calls[api]["gateway"]()
            timings: dict[str, list[tuple[float, float]]] = {"direct": [], "gateway": []}
            for _ in range(runs):
                timings["direct"].append(calls[api]["direct"]())
                timings["gateway"].append(calls[api]["gateway"]())
            for path, values in timings.items():
                firsts, totals = [v[0] for v in values], [v[1] for v in values]
                print(f"{api:<10} {path:<8} {summary(firsts)}   {summary(totals)}")
            added = statistics.median(t for _, t in timings["gateway"]) - statistics.median(
                t for _, t in timings["direct"]
            )
            print(f"{api:<10} added    p50 whole stream {added * 1000:+.2f} ms per call\n")

        for api in ("anthropic", "openai"):
            for path in ("direct", "gateway"):
                call = calls[api][path]
                started = time.perf_counter()
                with ThreadPoolExecutor(max_workers=concurrency) as pool:
                    list(pool.map(lambda _, call=call: call(), range(runs)))
                wall = time.perf_counter() - started
                print(
                    f"{api:<10} {path:<8} {runs} calls, {concurrency} at once: {wall:.2f} s ({runs / wall:.0f} calls/s)"
                )
        usage = gateway.usage("anthropic")
        served = server.usage_served()
        print(
            f"\ngateway usage (anthropic grant): {usage['requests']} requests, {usage['errors']} errors; "
            f"server served {served['requests']} requests in all; plan errors: {len(server.plan_errors)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    run(args.runs, args.warmup, args.concurrency)


if __name__ == "__main__":
    main()
