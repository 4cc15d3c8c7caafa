#!/usr/bin/env python3
"""Benchmark of ``qemu`` units (the driver, ``ale_iac/substrates/qemu/runtime.py``) on this host.

    .venv/bin/python bench/bench_qemu.py [--cold 3] [--restores 10] [--parallel 4] [--staging-mb 100] [--export]

* time to ready (``start()`` called -> first 200 from GET /status through the forwarder), p50/p95 (nearest
  rank): cold boots (``restore=False``) and restores from the saved memory state, one at a time; then
  ``--parallel`` restored units started at once (each one's time, and the wall time for all).
* memory per guest: RSS and USS of the QEMU process of an idle unit, cold-booted and restored.
* staging a folder of ``--staging-mb`` MB (32 files of random bytes) into the guest and pulling it back, by
  the guest share and by HTTP (the computer-server's file commands), in MB/s.
* ``--export``: the qcow2 export of the cached desktop rootfs, made afresh into a temporary folder.
* the saved state's own cost (its cold boot and the save), from its manifest.

Run as root with the desktop image built (scripts/setup.sh). Guests: 1 vCPU, 2 GiB (the qemu profile's shape).
Stops everything it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ale_iac.contract import LINUX_DESKTOP_PATHS, UnitOutputs
from ale_iac.image_build import export_context
from ale_iac.runner import tasks
from ale_iac.sandbox import transport
from ale_iac.sandbox.client import ComputerServerClient
from ale_iac.substrates.qemu import disk, launcher, runtime
from ale_iac.substrates.qemu.saved import find_saved_state

VCPUS, MEMORY_MB = 1, 2048


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def summary(label: str, values: list[float]) -> None:
    print(f"{label:<44} n={len(values):<3} p50 {pct(values, 50):7.2f} s  p95 {pct(values, 95):7.2f} s  "
          f"min {min(values):7.2f} s  max {max(values):7.2f} s")  # fmt: skip


def wait_ready(state: runtime.QemuSandboxState, deadline_s: float = 300.0) -> None:
    headers = {"Authorization": f"Bearer {state.token}"}
    end = time.monotonic() + deadline_s
    with httpx.Client(timeout=2.0, headers=headers) as client:
        while time.monotonic() < end:
            try:
                if client.get(f"{state.endpoint}/status").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
    raise RuntimeError(f"{state.sandbox_id} not ready in {deadline_s} s")


def spec(qdisk: disk.QemuDisk, name: str, restore: bool) -> runtime.QemuSandboxSpec:
    return runtime.QemuSandboxSpec(
        sandbox_id=name, disk=qdisk.disk, kernel=qdisk.kernel, initrd=qdisk.initrd, vcpus=VCPUS,
        memory_mb=MEMORY_MB, restore=restore,
    )  # fmt: skip


def start_ready(qdisk: disk.QemuDisk, name: str, restore: bool) -> tuple[runtime.QemuSandboxState, float]:
    started = time.monotonic()
    state = runtime.start(spec(qdisk, name, restore))
    wait_ready(state)
    return state, time.monotonic() - started


def memory(state: runtime.QemuSandboxState) -> str:
    assert state.pid is not None
    info = psutil.Process(state.pid).memory_full_info()
    return f"RSS {info.rss / 2**20:.0f} MiB, USS {info.uss / 2**20:.0f} MiB (guest -m {MEMORY_MB} MiB)"


def bench_boots(qdisk: disk.QemuDisk, count: int, restore: bool, label: str) -> None:
    times: list[float] = []
    agent: list[float] = []
    for i in range(count):
        state, seconds = start_ready(qdisk, f"bench-q-{'r' if restore else 'c'}{i}-{os.getpid()}", restore)
        times.append(seconds)
        agent.append(state.seconds_to_ready)
        if i == 0:
            time.sleep(5)  # idle a moment before measuring memory
            print(f"memory of an idle {label} guest: {memory(state)}")
        runtime.stop(state.sandbox_id)
    summary(f"{label}: start -> /status 200", times)
    summary(f"{label}: QEMU launch -> guest agent ready", agent)


def bench_parallel(qdisk: disk.QemuDisk, count: int) -> None:
    results: list[tuple[runtime.QemuSandboxState, float]] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            results.append(start_ready(qdisk, f"bench-q-p{i}-{os.getpid()}", True))
        except BaseException as exc:
            errors.append(exc)

    started = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    try:
        if errors:
            raise errors[0]
        summary(f"{count} restored units at once: each", [seconds for _, seconds in results])
        print(f"{count} restored units at once: wall {wall:.2f} s; memory: "
              + "; ".join(memory(state).split(" (")[0] for state, _ in results))  # fmt: skip
    finally:
        for state, _ in results:
            runtime.stop(state.sandbox_id)


def bench_staging(qdisk: disk.QemuDisk, megabytes: int) -> None:
    state, _ = start_ready(qdisk, f"bench-q-s-{os.getpid()}", True)
    handle = UnitOutputs(
        unit="u", provider="qemu", endpoint=state.endpoint, snapshot="s", image="i", resource_id=state.sandbox_id,
        paths=LINUX_DESKTOP_PATHS, transport="qemu",
    )  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "in"
            source.mkdir()
            for i in range(32):
                (source / f"f{i:02d}.bin").write_bytes(os.urandom(megabytes * 2**20 // 32))

            async def share_up(client: ComputerServerClient, local: Path, remote: str) -> int:
                return await transport.upload_dir(handle, client, local, remote, tasks.upload_dir)

            async def share_down(client: ComputerServerClient, remote: str, local: Path) -> int:
                return await transport.download_dir(handle, client, remote, local, tasks.download_dir)

            async def go() -> None:
                ways = (("guest share", share_up, share_down), ("http", tasks.upload_dir, tasks.download_dir))
                async with ComputerServerClient(state.endpoint, token=state.token) as client:
                    for name, up, down in ways:
                        remote = f"/data/tasks/bench-{name.replace(' ', '-')}"
                        t0 = time.monotonic()
                        await up(client, source, remote)
                        t1 = time.monotonic()
                        await down(client, remote, Path(tmp) / f"out-{name.replace(' ', '-')}")
                        t2 = time.monotonic()
                        rate_in, rate_out = megabytes / (t1 - t0), megabytes / (t2 - t1)
                        print(f"staging {megabytes} MB by {name:<12} in {rate_in:7.1f} MB/s ({t1 - t0:.2f} s), "
                              f"out {rate_out:7.1f} MB/s ({t2 - t1:.2f} s)")  # fmt: skip
                        await client.run_command(f"rm -rf {remote}")

            asyncio.run(go())
    finally:
        runtime.stop(state.sandbox_id)


def bench_export() -> None:
    context = export_context("desktop", print)
    image = context.image
    with tempfile.TemporaryDirectory(dir=image.path.parent) as tmp:
        started = time.monotonic()
        made = disk.export_qcow2(
            image.rootfs, Path(tmp), env=context.env, apt_conf=context.apt_conf, ca_bundle=None,
            log=lambda _line: None,
        )  # fmt: skip
        seconds = time.monotonic() - started
        manifest = made.manifest()
        print(f"qcow2 export of desktop: {seconds:.1f} s (steps {manifest['steps']}), "
              f"disk {int(str(manifest['disk_bytes'])) / 2**20:.0f} MiB")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--restores", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--staging-mb", type=int, default=100)
    parser.add_argument("--export", action="store_true")
    args = parser.parse_args()
    qdisk = disk.ensure_export("desktop")
    print(f"host: {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; accelerator: {launcher.kvm_status()[1]}")
    runtime.start(spec(qdisk, f"bench-q-warm-{os.getpid()}", True))  # the saved state, made once if missing
    runtime.stop(f"bench-q-warm-{os.getpid()}")
    saved = find_saved_state(spec(qdisk, "x", True).machine(), "host")
    assert saved is not None
    manifest = saved.manifest()
    print(f"saved state: cold boot {manifest['cold_boot_seconds']} s, save {manifest['save_seconds']} s, "
          f"{int(str(manifest['state_bytes'])) / 2**20:.0f} MiB")  # fmt: skip
    if args.restores:
        bench_boots(qdisk, args.restores, True, "restore")
    if args.parallel:
        bench_parallel(qdisk, args.parallel)
    if args.cold:
        bench_boots(qdisk, args.cold, False, "cold boot")
    if args.staging_mb:
        bench_staging(qdisk, args.staging_mb)
    if args.export:
        bench_export()


if __name__ == "__main__":
    main()
