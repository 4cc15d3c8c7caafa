"""Kubernetes units on the private single-node cluster: create to first answer, and teardown, for N units at once.

    scripts/kube-cluster.sh start && scripts/kube-cluster.sh load "$(ale-iac images build desktop --export oci)"
    .venv/bin/python bench/bench_kubernetes.py --units 1
    .venv/bin/python bench/bench_kubernetes.py --units 20 --memory-gb 0.5

One stack of N units of the shipped ``kubernetes`` profile (``pulumi up`` through the real engine and provider
plugin), every unit's handle (its port-forward) and readiness (a command and a screenshot through the forwarder)
awaited at once, then ``pulumi destroy``. Reported: the ``up`` time, each unit's ready time after the ``up``
began (min, median, max), the teardown, and the CPU seconds and peak RSS of the API server, the kubelet,
etcd and containerd over the run (their PIDs from the cluster's state dir, sampled every 0.5 s with psutil). The
shape's vCPUs are left out by default: requests are limits, and a 2-core node fits two 1-vCPU units.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import psutil  # noqa: E402

from ale_iac.cloud_routes import KubernetesRoute  # noqa: E402
from ale_iac.contract import Shape, parse_units  # noqa: E402
from ale_iac.engine import Engine  # noqa: E402
from ale_iac.infra.program import inline_program, pool_units  # noqa: E402
from ale_iac.profile import PoolSpec, resolve_profile  # noqa: E402
from ale_iac.sandbox.handle import SandboxHandle  # noqa: E402
from ale_iac.sandbox.readiness import wait_ready  # noqa: E402

STATE = Path(os.environ.get("ALE_IAC_KUBE_STATE", "/run/ale-iac-kube"))
WATCHED = ("kube-apiserver", "kubelet", "etcd", "containerd")


class Sampler:
    """CPU seconds used and peak RSS of the cluster's processes while the run lasts."""

    def __init__(self) -> None:
        self.procs = {name: psutil.Process(int((STATE / "run" / f"{name}.pid").read_text())) for name in WATCHED}
        self.cpu0 = {name: sum(p.cpu_times()[:2]) for name, p in self.procs.items()}
        self.peak = {name: p.memory_info().rss for name, p in self.procs.items()}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            for name, proc in self.procs.items():
                self.peak[name] = max(self.peak[name], proc.memory_info().rss)

    def report(self) -> str:
        self.stop.set()
        self.thread.join()
        parts = []
        for name, proc in self.procs.items():
            cpu = sum(proc.cpu_times()[:2]) - self.cpu0[name]
            parts.append(f"{name} {cpu:.1f} CPU-s, peak {self.peak[name] >> 20} MiB")
        return "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=1)
    parser.add_argument("--vcpus", type=int, default=None)
    parser.add_argument("--memory-gb", type=float, default=1.0)
    parser.add_argument("--stack", default="bench-kube")
    args = parser.parse_args()
    profile = resolve_profile("kubernetes").profile
    shape = Shape(vcpus=args.vcpus, memory_gb=args.memory_gb)
    routes = {
        n: r.model_copy(update={"shape": shape}) if isinstance(r, KubernetesRoute) else r
        for n, r in profile.snapshots.items()
    }
    profile = profile.model_copy(update={"snapshots": routes})
    units = pool_units(PoolSpec(units=args.units), args.stack)
    engine = Engine()
    sampler = Sampler()
    resolved: list[dict[str, object]] = []
    started = time.monotonic()
    engine.up(args.stack, inline_program(profile, units, args.stack, on_units=resolved.append))
    up_s = time.monotonic() - started
    try:
        outputs = parse_units(resolved[-1])

        async def ready(name: str) -> float:
            handle = await asyncio.to_thread(SandboxHandle.from_outputs, args.stack, outputs[name])
            await wait_ready(handle, 600)
            return time.monotonic() - started

        async def every() -> list[float]:
            return list(await asyncio.gather(*(ready(name) for name in outputs)))

        times = sorted(asyncio.run(every()))
        all_s = time.monotonic() - started
    finally:
        torn = time.monotonic()
        engine.destroy(args.stack)
        teardown_s = time.monotonic() - torn
    print(
        f"{args.units} unit(s) (shape {shape.model_dump(exclude_none=True)}): pulumi up {up_s:.1f} s; ready after "
        f"min {times[0]:.1f} / median {statistics.median(times):.1f} / max {times[-1]:.1f} s; all ready "
        f"{all_s:.1f} s; pulumi destroy {teardown_s:.1f} s"
    )
    print(f"cluster over the run: {sampler.report()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
