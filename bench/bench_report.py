"""Time and size of `ale-iac report` for a big run: by default 100 units with 50 screenshots each.

The record is synthetic (``tests/support/runs.py``: the runner's format, real 1280x800 PNGs, every
tenth unit failed); making it is not timed. Prints the median of ``--runs`` in-process builds
(``load_run`` + ``write_report``), one cold ``ale-iac report`` command (imports included), the sizes
of what it wrote, and with ``--browser`` what headless Chromium takes to open the summary and a
unit's page from disk (and how many of that page's screenshots it fetched at load).

    .venv/bin/python bench/bench_report.py [--units 100] [--screenshots 50] [--runs 3] [--browser]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ale_iac.report import load_run, write_report

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the synthetic records live with the tests

from tests.support.runs import Unit, make_run  # noqa: E402


def _size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def _mib(count: int) -> str:
    return f"{count / 2**20:.2f} MiB"


def _browser(out: Path, profile: Path, shots_per_unit: int) -> None:
    from selenium.webdriver.support.wait import WebDriverWait

    from tests.support.browser import requests_made, start_chromium

    driver = start_chromium(profile)
    try:
        page = sorted((out / "assets" / "units").glob("*.html"))[0]
        for name, path in (("index.html", out / "index.html"), (f"unit page ({page.name})", page)):
            requests_made(driver)
            driver.get(path.as_uri())
            WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.readyState") == "complete")
            timing = driver.execute_script(
                "const n = performance.getEntriesByType('navigation')[0];"
                "return [n.domContentLoadedEventEnd, n.loadEventEnd];"
            )
            shots = [u for u in requests_made(driver) if "/assets/shots/" in u]
            print(
                f"chromium {name}: DOMContentLoaded {timing[0]:.0f} ms, load {timing[1]:.0f} ms, "
                f"screenshots fetched at load {len(shots)}/{shots_per_unit if 'unit' in name else 0}"
            )
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--units", type=int, default=100)
    parser.add_argument("--screenshots", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--browser", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        units = [
            Unit(
                agent=f"agent{i % 4}",
                task=f"task-{i // 4:03d}",
                screenshots=args.screenshots,
                state="agent_failed" if i % 10 == 3 else "succeeded",
                tokens=True,
            )
            for i in range(args.units)
        ]
        start = time.perf_counter()
        run_dir = make_run(root, units, name="bench")
        made = time.perf_counter() - start
        print(f"synthetic record: {args.units} units x {args.screenshots} screenshots, made in {made:.1f} s")

        loads, writes = [], []
        out = run_dir / "report"
        for _ in range(args.runs):
            start = time.perf_counter()
            run = load_run(run_dir)
            loads.append(time.perf_counter() - start)
            start = time.perf_counter()
            write_report(run, out)
            writes.append(time.perf_counter() - start)
        load, write = statistics.median(loads), statistics.median(writes)
        print(f"in process (median of {args.runs}): load_run {load:.2f} s, write_report {write:.2f} s")
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "ale_iac", "report", str(run_dir)], cwd=REPO, check=True, capture_output=True
        )
        print(f"cold `ale-iac report` command: {time.perf_counter() - start:.2f} s")

        pages = sorted((out / "assets" / "units").glob("*.html"))
        plots = sorted((out / "assets" / "plots").glob("*.svg"))
        shots = sorted((out / "assets" / "shots").rglob("*.png"))
        linked = sum(1 for p in shots if p.stat().st_nlink > 1)
        html = [out / "index.html", *pages, out / "assets" / "style.css"]
        print(f"index.html: {_mib(_size([out / 'index.html']))}")
        largest = max(p.stat().st_size for p in pages)
        print(f"unit pages: {len(pages)}, {_mib(_size(pages))} in all, the largest {_mib(largest)}")
        print(f"plots: {len(plots)} SVG, {_mib(_size(plots))}")
        print(f"screenshots: {len(shots)}, {_mib(_size(shots))} ({linked} hard-linked to the record, not copied)")
        print(f"report without the screenshots: {_mib(_size(html + plots))}")
        if args.browser:
            _browser(out, root / "chromium-profile", args.screenshots)


if __name__ == "__main__":
    main()
