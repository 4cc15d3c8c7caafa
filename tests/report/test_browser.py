"""Reports opened from disk in a real headless Chromium: what a person sees, and that nothing is fetched.

The synthetic-record tests run in the fast lane (they need only Chromium); the last one reads a run
made by ``ale-iac evaluate`` with real sandboxes (``real_run``), so it carries ``sandbox`` and ``engine``.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageStat
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from ale_iac.report import load_run, write_report
from tests.report.conftest import REAL_TASKS, REPO
from tests.support.browser import requests_made
from tests.support.runs import HOSTILE, Unit, make_run

# One worker builds the real run for all of them.
pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("report-browser")]


def _open(browser: WebDriver, page: Path) -> None:
    requests_made(browser)  # drain what earlier pages asked for
    browser.get(page.as_uri())
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")


def _assert_only_files(urls: list[str]) -> None:
    assert urls, "the performance log saw no request at all: it is not working"
    assert [u for u in urls if not u.startswith("file://")] == []


def _loaded(browser: WebDriver, img: WebElement, timeout: float = 30) -> None:
    browser.execute_script("arguments[0].scrollIntoView()", img)
    WebDriverWait(browser, timeout).until(
        lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
    )


def _not_blank(img: WebElement) -> None:
    """The image as the browser drew it has real content: many grey levels, not one flat colour."""
    shot = Image.open(io.BytesIO(img.screenshot_as_png)).convert("L")
    low, high = shot.getextrema()
    assert high - low > 100 and ImageStat.Stat(shot).stddev[0] > 10


def _shot_images(browser: WebDriver) -> list[WebElement]:
    return browser.find_elements(By.CSS_SELECTOR, "figure.shot img")


def test_thousands_of_screenshots_load_only_as_they_scroll_into_view(tmp_path: Path, browser: WebDriver) -> None:
    out = tmp_path / "report"
    write_report(load_run(make_run(tmp_path, [Unit(screenshots=60)])), out)
    [page] = (out / "assets" / "units").glob("*.html")
    _open(browser, page)
    images = _shot_images(browser)
    assert len(images) == 60
    at_load = [u for u in requests_made(browser) if "/assets/shots/" in u]
    assert 1 <= len(at_load) < 20, at_load  # only those near the top of the page
    _loaded(browser, images[-1])
    _not_blank(images[-1])
    after = requests_made(browser)
    assert any(u.endswith(images[-1].get_attribute("src").rsplit("/", 1)[-1]) for u in after)  # type: ignore[union-attr]
    _assert_only_files(at_load + after)


def test_a_failed_and_an_unfinished_run_render_and_agent_text_stays_text(tmp_path: Path, browser: WebDriver) -> None:
    units = [
        Unit(task="ok"),
        Unit(task="crash", state="agent_failed"),
        Unit(task="busy", state="running"),
        Unit(task="stopped", state="interrupted"),
        Unit(task="later", state="queued"),
    ]
    out = tmp_path / "report"
    write_report(load_run(make_run(tmp_path, units)), out)
    _open(browser, out / "index.html")
    urls = requests_made(browser)
    rows = browser.find_elements(By.CSS_SELECTOR, "table.units tbody tr")
    cells = [[c.text for c in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert [(c[0], c[4].split()[0]) for c in cells] == [
        (u.unit_id, {"ok": "succeeded", "crash": "agent_failed", "stopped": "interrupted"}.get(u.task, u.state))
        for u in units
    ]
    browser.find_element(By.LINK_TEXT, units[1].unit_id).click()
    WebDriverWait(browser, 30).until(lambda d: units[1].unit_id in d.title)
    assert browser.title.startswith(units[1].unit_id)  # not "pwned": the agent's <script> did not run
    assert "agent crashed (exit -11)" in browser.find_element(By.ID, "errors").text
    conversation = browser.find_element(By.CSS_SELECTOR, "ol.conversation").text
    assert HOSTILE in conversation  # shown as the text it is
    assert browser.find_elements(By.CSS_SELECTOR, "ol.conversation script, ol.conversation img[src=x]") == []
    browser.find_element(By.LINK_TEXT, "next unit").click()
    WebDriverWait(browser, 30).until(lambda d: units[2].unit_id in d.title)
    assert "Running when this report was made: in phase agent" in browser.find_element(By.TAG_NAME, "header").text
    _assert_only_files(urls + requests_made(browser))


def _units_table_fits(browser: WebDriver, width: int) -> list[int]:
    """At a window ``width`` px wide: the width of the units table's content, and of the box that scrolls it."""
    browser.set_window_size(width, 900)
    try:
        WebDriverWait(browser, 30).until(lambda d: d.execute_script("return window.innerWidth") == width)
        box = browser.find_element(By.CSS_SELECTOR, "#units .scroll")
        widths: list[int] = browser.execute_script("return [arguments[0].scrollWidth, arguments[0].clientWidth]", box)
        return widths
    finally:
        browser.set_window_size(1280, 900)


def test_the_units_table_fits_a_1400_px_window(tmp_path: Path, browser: WebDriver) -> None:
    """Long unit ids, task names, token counts and every phase a real run records: no sideways scrolling."""
    units = [
        Unit(agent=agent, task=task, repeat=repeat, state=state, tokens=True, screenshots=0, load_s=0.04)
        for agent in ("claude_code", "scripted")
        for task in ("mixed-clipboard-total", "cli-log-stats", "gui-notepad")
        for repeat, state in ((0, "succeeded"), (1, "agent_failed"))
    ]
    units[-1].state = "running"
    out = tmp_path / "report"
    write_report(load_run(make_run(tmp_path, units)), out)
    _open(browser, out / "index.html")
    assert len(browser.find_elements(By.CSS_SELECTOR, "table.units th.phase")) == 7
    content, box = _units_table_fits(browser, 1400)
    assert content <= box, f"the units table is {content} px wide in a {box} px box"
    # The unit ids may wrap, but they read (and link) as themselves.
    assert browser.find_element(By.LINK_TEXT, units[0].unit_id).get_attribute("href")


@pytest.mark.sandbox
@pytest.mark.engine
def test_the_report_of_a_real_run(real_run: Path, tmp_path: Path, browser: WebDriver) -> None:
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "ale_iac", "report", str(real_run), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    units = sorted(p.parent.name for p in real_run.glob("*/run.json"))
    assert len(units) == 2 * len(REAL_TASKS)

    # The summary: every unit, with the status its record has.
    _open(browser, out / "index.html")
    urls = requests_made(browser)
    rows = browser.find_elements(By.CSS_SELECTOR, "table.units tbody tr")
    shown = {row.find_element(By.TAG_NAME, "a").text: row.find_elements(By.TAG_NAME, "td")[4].text for row in rows}
    recorded = {u: json.loads((real_run / u / "run.json").read_text())["status"] for u in units}
    assert shown == recorded
    assert set(recorded.values()) == {"succeeded", "agent_failed"}
    for plot in browser.find_elements(By.CSS_SELECTOR, "#plots img"):
        assert browser.execute_script("return arguments[0].naturalWidth", plot) > 0
    content, box = _units_table_fits(browser, 1400)
    assert content <= box, f"the units table is {content} px wide in a {box} px box"

    # A trajectory: the tool calls in the order the agent made them, the screenshots where it took them.
    notepad = "scripted__gui-notepad__r0"
    browser.find_element(By.LINK_TEXT, notepad).click()
    WebDriverWait(browser, 30).until(lambda d: notepad in d.title)
    trajectory = json.loads((real_run / notepad / "trajectory.json").read_text())
    expected = [c["function_name"] for s in trajectory["steps"] for c in s.get("tool_calls") or []]
    calls = [e.text.split()[0] for e in browser.find_elements(By.CSS_SELECTOR, ".call .call-name")]
    assert calls == expected and "cua.screenshot" in calls and "cua.click" in calls
    images = _shot_images(browser)
    assert len(images) == sum(
        len((r.get("extra") or {}).get("screenshots", []))
        for s in trajectory["steps"]
        for r in (s.get("observation") or {}).get("results", [])
    )
    first = images[0]
    step = first.find_element(By.XPATH, "ancestor::li[contains(@class, 'step')]")
    assert "cua.screenshot" in step.find_element(By.CSS_SELECTOR, ".call-name").text
    _loaded(browser, first)
    assert browser.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", first) == [
        1280,
        800,
    ]
    _not_blank(first)
    urls += requests_made(browser)
    assert any("/assets/shots/" in u for u in urls)
    _assert_only_files(urls)

    # The crashed unit: its error, in its phase.
    _open(browser, out / "index.html")
    browser.find_element(By.LINK_TEXT, "crash__gui-notepad__r0").click()
    WebDriverWait(browser, 30).until(lambda d: "crash__gui-notepad__r0" in d.title)
    errors = browser.find_element(By.ID, "errors").text
    assert "in phase agent" in errors and "agent crashed (exit -11)" in errors and "agent.log" in errors
    _assert_only_files(requests_made(browser))
