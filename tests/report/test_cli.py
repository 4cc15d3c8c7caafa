"""`ale-iac report RUN_DIR [--compare OTHER] [--out DIR] [--open] [--serve]`, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from tests.support.cli import ale_iac
from tests.support.runs import Unit, make_run

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return ale_iac("report", *args, env=env, timeout=120)


def test_report_writes_into_the_run_folder_by_default(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, [Unit(), Unit(task="t2", state="running")])
    proc = _cli(str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"report of synth-20261201-040000-00001 (2 units, in progress): {run_dir / 'report' / 'index.html'}"
    )
    assert (run_dir / "report" / "assets" / "style.css").is_file()


def test_compare_with_another_experiment_warns(tmp_path: Path) -> None:
    this = make_run(tmp_path, [Unit()])
    other = make_run(tmp_path, [Unit()], name="elsewhere")
    proc = _cli(str(this), "--compare", str(other), "--out", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr
    assert "warning: comparing runs of different experiments (synth, elsewhere)" in proc.stderr
    assert "These are runs of different experiments" in (tmp_path / "cmp" / "index.html").read_text()


def test_a_missing_run_folder_is_an_error(tmp_path: Path) -> None:
    proc = _cli(str(tmp_path / "nope"))
    assert proc.returncode == 2 and f"error: {tmp_path / 'nope'} is not a folder" in proc.stderr


def test_open_hands_the_file_to_the_browser(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, [Unit()])
    opened = tmp_path / "opened.txt"
    browser = f"{sys.executable} -c 'import sys; open(sys.argv[2], \"w\").write(sys.argv[1])' %s {opened}"
    proc = _cli(str(run_dir), "--open", env={**os.environ, "BROWSER": browser})
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 30
    while not opened.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert opened.read_text() == (run_dir / "report" / "index.html").as_uri()


def test_serve_listens_on_loopback_only_and_serves_the_report(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, [Unit(screenshots=1)])
    proc = subprocess.Popen(
        [sys.executable, "-m", "ale_iac", "report", str(run_dir), "--serve"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        match = re.search(r"serving .* at (http://127\.0\.0\.1:(\d+)/index\.html)", lines[1])
        assert match, lines
        url, port = match.group(1), int(match.group(2))
        listening = [c for c in psutil.Process(proc.pid).net_connections() if c.status == psutil.CONN_LISTEN]
        assert [(c.laddr.ip, c.laddr.port) for c in listening] == [("127.0.0.1", port)]
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "synth-20261201-040000-00001" in page.text
        unit = re.search(r'href="(assets/units/[^"]+\.html)"', page.text)
        assert unit is not None
        unit_page = httpx.get(url.replace("index.html", unit.group(1)), timeout=10)
        [img] = re.findall(r'<img loading="lazy" decoding="async" src="([^"]+)"', unit_page.text)
        image = httpx.get(str(httpx.URL(str(unit_page.url)).join(img)), timeout=10)
        assert image.status_code == 200 and image.headers["content-type"] == "image/png"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
