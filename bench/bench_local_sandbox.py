#!/usr/bin/env python3
"""Benchmark of ``local`` sandboxes: image build, start-to-ready, parallel starts, idle memory.

    .venv/bin/python bench/bench_local_sandbox.py [--runs 10] [--parallel 4] [--cold-build]

* image build, cached: ``build_image("desktop")`` when the current recipe is already built.
* image build, cold (``--cold-build``): the same into an empty temporary cache (debootstrap, apt,
  pip from the network); the temporary cache is deleted afterwards.
* start -> first 200 from GET /status, for one sandbox at a time and for N started at once
  (p50/p95 over all samples; nearest-rank percentiles). ``start()`` itself returns earlier, as
  soon as the processes and the port forward exist; that is reported separately.
* RSS of an idle sandbox: VmRSS summed over its processes (supervisor, bwrap, slirp4netns, the
  init, Xvfb, openbox, computer-server), a few seconds after it became ready.

Run as root on a host with the packages of scripts/apt-packages.txt (root mode), or as a normal user
with an image of its own (rootless mode: docs/rootless.md; no build timings then). ``--as-user`` (as
root) also runs the same measurements rootless, as a throwaway user made like the tests make theirs
(tests/support/rootless.py: useradd, the image published and unpacked, removed at the end).
Stops everything it starts.
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ale_iac import procs
from ale_iac.image_build import build_image
from ale_iac.images import ImageInfo, require_image
from ale_iac.substrates.local import host as local_host
from ale_iac.substrates.local import runtime as local_runtime
from ale_iac.substrates.local import sandboxes as local_sandboxes
from ale_iac.substrates.local.sandboxes import LocalSandboxSpec, LocalSandboxState

POLL_INTERVAL_S = 0.02
READY_TIMEOUT_S = 120.0


@dataclass
class StartSample:
    start_returned_s: float
    ready_s: float
    stop_s: float


def wait_for_status(state: LocalSandboxState, started: float) -> float:
    endpoint = state.endpoint
    deadline = started + READY_TIMEOUT_S
    with httpx.Client(timeout=2.0, headers={"Authorization": f"Bearer {local_sandboxes.auth_token(state)}"}) as client:
        while True:
            try:
                if client.get(f"{endpoint}/status").status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{endpoint}/status not ready within {READY_TIMEOUT_S} s")
            time.sleep(POLL_INTERVAL_S)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def one_start(image: ImageInfo, home: Path, keep: list[LocalSandboxState] | None = None) -> StartSample:
    spec = LocalSandboxSpec(sandbox_id=f"bench-{secrets.token_hex(4)}", rootfs=str(image.rootfs))
    started = time.monotonic()
    state = local_runtime.start(spec, home=home)
    returned = time.monotonic() - started
    try:
        ready = wait_for_status(state, started)
    finally:
        if keep is None:
            t0 = time.monotonic()
            local_runtime.stop(state.sandbox_id, home=home)
            stop_s = time.monotonic() - t0
        else:
            keep.append(state)
            stop_s = float("nan")
    return StartSample(returned, ready, stop_s)


def parallel_starts(image: ImageInfo, home: Path, count: int) -> tuple[list[StartSample], float]:
    samples: list[StartSample] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker() -> None:
        try:
            sample = one_start(image, home)
        except BaseException as exc:
            with lock:
                errors.append(exc)
            return
        with lock:
            samples.append(sample)

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    if errors:
        raise errors[0]
    return samples, wall


def process_name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if any("ale_iac.substrates.local.supervisor" in word for word in words):
        return "supervisor"
    if "-m" in words:
        return words[words.index("-m") + 1]
    if words and words[0].endswith("python3") and len(words) > 1:
        return os.path.basename(words[1])
    return os.path.basename(words[0]) if words else "?"


def idle_rss(image: ImageInfo, home: Path, settle_s: float) -> tuple[int, dict[str, int]]:
    kept: list[LocalSandboxState] = []
    one_start(image, home, keep=kept)
    state = kept[0]
    try:
        time.sleep(settle_s)  # let the server finish its startup work: this measures an idle sandbox
        pids = local_sandboxes.sandbox_pids(state)
        per_process = {f"{process_name(pid)} ({pid})": procs.rss_bytes([pid]) for pid in pids}
        return procs.rss_bytes(pids), per_process
    finally:
        local_runtime.stop(state.sandbox_id, home=home)


def row(label: str, values: list[float]) -> str:
    return (
        f"| {label:<44} | {percentile(values, 0.5):7.2f} | {percentile(values, 0.95):7.2f} | "
        f"{min(values):7.2f} | {max(values):7.2f} | {len(values):3d} |"
    )


@dataclass
class Starts:
    """What the sandbox runs measured (build timings aside)."""

    sequential: list[StartSample]
    parallel: list[StartSample]
    walls: list[float]
    rss_total: int
    rss_parts: dict[str, int]
    leftovers: int
    load_before: float


def cold_build() -> tuple[float, str]:
    """A build into an empty temporary cache (deleted afterwards): its time and a line about it."""
    cache = Path(tempfile.mkdtemp(prefix="ale-bench-cache-"))
    previous = os.environ.get("ALE_IAC_CACHE")
    os.environ["ALE_IAC_CACHE"] = str(cache)
    try:
        t0 = time.monotonic()
        cold = build_image("desktop", log=lambda line: print(f"  cold build: {line}", file=sys.stderr))
        return time.monotonic() - t0, f"cold build steps: {cold.steps}; size {cold.size_bytes / 2**20:.0f} MiB"
    finally:
        if previous is None:
            os.environ.pop("ALE_IAC_CACHE", None)
        else:
            os.environ["ALE_IAC_CACHE"] = previous
        shutil.rmtree(cache, ignore_errors=True)


def the_image(root: bool) -> tuple[ImageInfo, list[float]]:
    """The desktop image and, as root (who builds it), three timings of a build that is already cached."""
    if not root:
        return require_image("desktop"), []
    image = build_image("desktop", log=lambda line: print(f"  build: {line}", file=sys.stderr))
    cached = []
    for _ in range(3):
        t0 = time.monotonic()
        build_image("desktop", log=lambda _line: None)
        cached.append(time.monotonic() - t0)
    return image, cached


def measure_starts(image: ImageInfo, args: argparse.Namespace) -> Starts:
    """Starts one at a time, rounds of parallel starts, an idle sandbox's memory; stops every sandbox."""
    load_before = os.getloadavg()[0]
    home = Path(tempfile.mkdtemp(prefix="ale-bench-home-"))
    try:
        one_start(image, home)  # warm the page cache; not counted
        sequential = [one_start(image, home) for _ in range(args.runs)]
        parallel: list[StartSample] = []
        walls: list[float] = []
        for _ in range(args.runs):
            samples, wall = parallel_starts(image, home, args.parallel)
            parallel += samples
            walls.append(wall)
        rss_total, rss_parts = idle_rss(image, home, args.settle)
        leftovers = local_sandboxes.list_sandboxes(home=home)
    finally:
        for state in local_sandboxes.list_sandboxes(home=home):
            local_runtime.stop(state.sandbox_id, home=home)
        shutil.rmtree(home, ignore_errors=True)
    return Starts(sequential, parallel, walls, rss_total, rss_parts, len(leftovers), load_before)


def print_report(
    image: ImageInfo, args: argparse.Namespace, cold_s: float | None, cached: list[float], starts: Starts
) -> None:
    print()
    print(
        f"mode {local_host.host_mode()} (uid {os.geteuid()}); "
        f"image {image.ref}: {image.size_bytes / 2**20:.0f} MiB, computer-server {image.computer_server_version}; "
        f"host {os.cpu_count()} CPUs"
    )
    print(
        f"host load average (1 min) before/after the sandbox runs: {starts.load_before:.1f} / {os.getloadavg()[0]:.1f}"
    )
    print("| measurement (seconds)                        |     p50 |     p95 |     min |     max |   n |")
    print("|----------------------------------------------|---------|---------|---------|---------|-----|")
    if cold_s is not None:
        print(row("image build, cold (empty cache)", [cold_s]))
    if cached:
        print(row("image build, cached", cached))
    sequential, parallel = starts.sequential, starts.parallel
    print(row("1 sandbox: start() returns", [s.start_returned_s for s in sequential]))
    print(row("1 sandbox: start() -> first 200 /status", [s.ready_s for s in sequential]))
    print(row("1 sandbox: stop()", [s.stop_s for s in sequential]))
    print(row(f"{args.parallel} at once: start() returns", [s.start_returned_s for s in parallel]))
    print(row(f"{args.parallel} at once: start() -> first 200 /status", [s.ready_s for s in parallel]))
    print(row(f"{args.parallel} at once: all {args.parallel} ready (wall)", starts.walls))
    print()
    print(f"idle sandbox RSS (after {args.settle:.0f} s idle): {starts.rss_total / 2**20:.1f} MiB total")
    for name, rss in sorted(starts.rss_parts.items(), key=lambda item: -item[1]):
        print(f"  {rss / 2**20:7.1f} MiB  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="sequential starts, and rounds of parallel starts")
    parser.add_argument("--parallel", type=int, default=4, help="sandboxes started at once per round")
    parser.add_argument("--cold-build", action="store_true", help="also time a build into an empty cache")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds idle before measuring RSS")
    parser.add_argument("--as-user", action="store_true", help="(root) then the same, rootless, as a throwaway user")
    args = parser.parse_args()
    root = os.geteuid() == 0
    cold_s, cold_line = cold_build() if args.cold_build else (None, None)
    image, cached = the_image(root)
    starts = measure_starts(image, args)
    print_report(image, args, cold_s, cached, starts)
    if cold_line:
        print(cold_line)
    if starts.leftovers:
        print(f"WARNING: {starts.leftovers} sandboxes were left and have been stopped")
    if args.as_user and root:
        return run_as_user(args)
    return 0


def run_as_user(args: argparse.Namespace) -> int:
    """The same measurements as a normal user (rootless), printed after root's."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.rootless import normal_user, publish_for_users

    shared = Path(tempfile.mkdtemp(prefix="ale-bench-images-"))
    try:
        os.chmod(shared, 0o755)
        publish_for_users(shared)
        with normal_user(expose=[str(shared)]) as user:
            user.env["ALE_IAC_IMAGE_PATH"] = str(shared)
            t0 = time.monotonic()
            user.python("from ale_iac.images import require_image; require_image('desktop')")
            print(
                f"\nrootless, as {user.name}: published image unpacked into its cache in {time.monotonic() - t0:.1f} s"
            )
            argv = [sys.executable, str(Path(__file__).resolve()), "--runs", str(args.runs)]
            argv += ["--parallel", str(args.parallel), "--settle", str(args.settle)]
            done = user.run(argv, timeout=3600)
            print(done.stdout, end="")
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
            return done.returncode
    finally:
        shutil.rmtree(shared, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
