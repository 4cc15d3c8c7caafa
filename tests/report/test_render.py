"""The report on disk: escaped, self-contained, lazy screenshots, plots as SVG, safe to rebuild."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ale_iac.errors import AleIacError
from ale_iac.report import load_run, write_report
from tests.support.runs import HOSTILE, Unit, grid, make_run


class Tags(HTMLParser):
    """Every start tag of a page, with its attributes."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for name, attrs in self.tags if name == tag]


def _pages(out: Path) -> list[Path]:
    return [out / "index.html", *sorted((out / "assets" / "units").glob("*.html"))]


def test_agent_output_is_escaped_everywhere_and_pages_run_no_script(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, [Unit(task="x<b>y&z", screenshots=1), Unit(task="t2", state="agent_failed")])
    out = tmp_path / "report"
    write_report(load_run(run_dir), out)
    pages = _pages(out)
    assert len(pages) == 3
    for page in pages:
        html = page.read_text()
        tags = Tags(html)
        assert tags.all("script") == [] and "<script" not in html
        assert not any(k.startswith("on") for _, attrs in tags.tags for k in attrs), page
        [csp] = [a for a in tags.all("meta") if a.get("http-equiv") == "Content-Security-Policy"]
        assert "default-src 'none'" in (csp["content"] or "")
    index = (out / "index.html").read_text()
    # Escaped, with a break opportunity after each "__" of the unit id (the units table wraps it there).
    assert "synthetic__<wbr>x&lt;b&gt;y&amp;z__<wbr>r0" in index and "<b>y" not in index
    unit_page = next(p for p in pages if "x-b-y-z" in p.name)  # the page's file name is a slug
    assert "&lt;script&gt;document.title=&#34;pwned&#34;&lt;/script&gt;" in unit_page.read_text()
    assert HOSTILE not in unit_page.read_text()


def test_screenshots_are_linked_into_the_assets_and_load_lazily(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, [Unit(screenshots=4)])
    out = tmp_path / "report"
    write_report(load_run(run_dir), out)
    [page] = (out / "assets" / "units").glob("*.html")
    shots = [a for a in Tags(page.read_text()).all("img") if "screenshot" in (a.get("alt") or "")]
    assert len(shots) == 4
    sources = run_dir / "synthetic__task-1__r0" / "agent" / "screenshots"
    for number, attrs in enumerate(shots, start=1):
        assert attrs["loading"] == "lazy" and (attrs["width"], attrs["height"]) == ("1280", "800")
        target = (page.parent / (attrs["src"] or "")).resolve()
        assert target.is_relative_to(out.resolve()) and target.is_file()
        source = sources / f"step-{number}.png"
        assert target.read_bytes() == source.read_bytes()
        assert os.path.samefile(target, source)  # same file system: a hard link, no copy


def test_plots_are_svg_files_with_every_unit(tmp_path: Path) -> None:
    units = grid(2, 3, screenshots=0)
    out = tmp_path / "report"
    write_report(load_run(make_run(tmp_path, units)), out)
    index = Tags((out / "index.html").read_text())
    plots = [a["src"] for a in index.all("img") if (a.get("src") or "").endswith(".svg")]
    assert plots == ["assets/plots/phases-per-unit.svg", "assets/plots/phase-spread.svg"]
    bars = ET.parse(out / plots[0]).getroot()
    texts = {t.text for t in bars.iter("{http://www.w3.org/2000/svg}text")}
    assert {u.unit_id for u in units} <= texts and {"provision", "agent", "cleanup"} <= texts
    assert len(list((out / "assets" / "plots").glob("unit-*.svg"))) == len(units)


def test_a_failed_and_an_interrupted_run_render(tmp_path: Path) -> None:
    units = [
        Unit(task="ok"),
        Unit(task="crash", state="agent_failed"),
        Unit(task="broken", state="setup_failed"),
        Unit(task="busy", state="running"),
        Unit(task="stopped", state="interrupted"),
        Unit(task="later", state="queued"),
    ]
    out = tmp_path / "report"
    write_report(load_run(make_run(tmp_path, units)), out)
    index = (out / "index.html").read_text()
    assert "In progress when this report was made: 1 running, 1 queued" in index
    for status in ("succeeded", "agent_failed", "setup_failed", "running", "interrupted", "queued"):
        assert f'<span class="status {status}">{status}</span>' in index
    pages = {p.name.split("-", 1)[1].split("__")[1]: p.read_text() for p in _pages(out)[1:]}
    assert set(pages) == {"ok", "crash", "broken", "busy", "stopped", "later"}
    assert "Running when this report was made: in phase agent" in pages["busy"]
    assert "No trajectory yet" in pages["busy"] and "No trajectory yet" in pages["later"]
    assert "RuntimeError: setup fails on purpose" in pages["broken"] and "in phase setup" in pages["broken"]
    assert "the run was interrupted" in pages["stopped"]
    assert "agent crashed (exit -11)" in pages["crash"] and "Segmentation fault" in pages["crash"]
    assert 'href="#step-7"' in pages["crash"]  # the tool error links to its step


def test_a_comparison_shows_score_and_time_differences(tmp_path: Path) -> None:
    this = make_run(tmp_path, grid(1, 1, repeats=2, screenshots=0))
    units = grid(1, 1, repeats=2, screenshots=0)
    units[1].state = "agent_failed"
    other = make_run(tmp_path, units, stamp="20261202-000000-00002")
    out = tmp_path / "report"
    write_report(load_run(this), out, load_run(other))
    index = (out / "index.html").read_text()
    assert "Compared with synth-20261202-000000-00002" in index
    assert '<td class="num ok">+0.50</td>' in index  # 1.00 here against 0.50 there


def test_a_report_replaces_only_a_report(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, [Unit(screenshots=1)])
    run = load_run(run_dir)
    not_a_report = tmp_path / "docs"
    not_a_report.mkdir()
    (not_a_report / "keep.txt").write_text("mine")
    with pytest.raises(AleIacError, match="not an ale-iac report"):
        write_report(run, not_a_report)
    assert (not_a_report / "keep.txt").read_text() == "mine"
    with pytest.raises(AleIacError, match="over the run folder"):
        write_report(run, run_dir)

    out = run_dir / "report"  # the default place
    write_report(run, out)
    (out / "assets" / "stale.txt").write_text("from an older report")
    write_report(load_run(run_dir), out)
    assert not (out / "assets" / "stale.txt").exists() and (out / "index.html").is_file()
    assert [p.name for p in run_dir.iterdir() if p.name.startswith(".")] == []  # no staging left behind
    assert [u.unit_id for u in load_run(run_dir).units] == ["synthetic__task-1__r0"]  # the report is no unit


def test_the_report_says_where_the_run_ran_and_what_the_grader_returned(tmp_path: Path) -> None:
    setup = {
        "profile": "docker",
        "profile_file": "/src/stacks/Pulumi.docker.yaml",
        "pool": None,
        "agents": [{"name": "synthetic", "executor": "docker", "model": "claude-x", "model_base_url": None}],
    }
    details = {"errors": {"credit": 1.0, "weight": 0.5}, "warnings": 0, "note": "<b>x</b>"}
    this = make_run(tmp_path, [Unit(score=0.5, details=details)], setup=setup)
    other = make_run(tmp_path, [Unit()], stamp="20261202-000000-00002")
    out = tmp_path / "report"
    write_report(load_run(this), out, load_run(other))
    index = (out / "index.html").read_text()
    assert "On profile <code>docker</code> <small>(/src/stacks/Pulumi.docker.yaml)</small>." in index
    assert "<tr><td>synthetic</td><td>docker</td><td>claude-x</td></tr>" in index
    assert "The two runs ran on different setups" in index
    assert "synth-20261202-000000-00002: profile <code>local</code>; synthetic: executor <code>?</code>" in index
    [page] = (out / "assets" / "units").glob("*.html")
    html = page.read_text()
    assert "executor <code>docker</code>, model <code>claude-x</code>" in html
    grading = html[html.index('<section id="grading">') :].split("</section>", 1)[0]
    assert "<tr><td>errors</td><td><code>{&#34;credit&#34;: 1.0, &#34;weight&#34;: 0.5}</code></td></tr>" in grading
    assert "<tr><td>warnings</td><td><code>0</code></td></tr>" in grading
    assert "<tr><td>note</td><td><code>&lt;b&gt;x&lt;/b&gt;</code></td></tr>" in grading


def test_a_units_egress_attempts_are_shown_allowed_and_refused(tmp_path: Path) -> None:
    unit = Unit()
    run_dir = make_run(tmp_path, [unit])
    folder = run_dir / unit.unit_id
    run = json.loads((folder / "run.json").read_text())
    run["egress"] = {
        "policy": "proxy: allow pypi.org; ports 80, 443",
        "attempts": 2,
        "allowed": 1,
        "refused": 1,
        "bytes_out": 120,
        "bytes_in": 5000,
        "refused_destinations": ["<evil>.test:80"],
        "channel_bytes_out": 900,
        "channel_bytes_in": 5100,
    }
    (folder / "run.json").write_text(json.dumps(run))
    attempts = [
        {"time": 0.5, "host": "pypi.org", "port": 443, "method": "CONNECT", "allowed": True, "reason": "allow pypi.org"}
        | {"address": "198.18.0.10", "bytes_out": 100, "bytes_in": 5000},
        {"time": 1.0, "host": "<evil>.test", "port": 80, "method": "GET", "allowed": False}
        | {"reason": "no allow entry matches the name", "address": None, "bytes_out": 20, "bytes_in": 0},
    ]
    (folder / "egress.jsonl").write_text("".join(json.dumps(a) + "\n" for a in attempts) + '{"torn')
    loaded = load_run(run_dir)
    out = tmp_path / "report"
    write_report(loaded, out)
    [page] = (out / "assets" / "units").glob("*.html")
    section = page.read_text().split('<section id="egress">', 1)[1].split("</section>", 1)[0]
    assert "Policy: <code>proxy: allow pypi.org; ports 80, 443</code>. 2 attempt(s): 1 allowed" in section
    assert "900 bytes out, 5100 in through the unit's channel" in section
    assert "<td><code>pypi.org:443</code></td>" in section and "<td>allowed</td>" in section
    assert '<tr class="bad">' in section and "<td><code>&lt;evil&gt;.test:80</code></td>" in section
    assert "<td>no allow entry matches the name</td>" in section
    assert "00:00:00.500" in section
    assert any("egress.jsonl line 3" in p for u in loaded.units for p in u.problems)
