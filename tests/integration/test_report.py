"""What-if reports: one HTML page that needs nothing but a browser.

Every figure is an inline PNG, the page loads no URL, every piece of text from a run is escaped,
and with two runs the summary shows the second against the first, absolute and in percent.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tiny_dict

from deepinfer_sim.cli_plan import report
from deepinfer_sim.errors import UserError
from deepinfer_sim.planner.report import PANELS, render_report
from deepinfer_sim.scenario import scenario_from_dict
from deepinfer_sim.sim.engine import simulate


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two tiny runs: EP8 decode with the reference prefix store, EP16 with a 3FS store."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, over in (
        ("ep8", {}),
        ("ep16-store", {"pools.decode.ep": 16, "pools.storage.nodes": 24}),
    ):
        sc = scenario_from_dict(tiny_dict(**{"workload.max_requests": 80, **over}))
        out[name] = simulate(sc).write(root / name, plots=False)
    return out


class _Checker(HTMLParser):
    """Collects tags, checks that every opened element is closed in order."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input", "col", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.doctype = False

    def handle_decl(self, decl: str) -> None:
        self.doctype = self.doctype or decl.lower() == "doctype html"

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def check_page(text: str) -> _Checker:
    """Well-formed HTML5 that references nothing outside itself."""
    page = _Checker()
    page.feed(text)
    page.close()
    assert page.doctype, "no <!DOCTYPE html>"
    assert page.errors == [] and page.stack == []
    assert "http://" not in text and "https://" not in text and "url(" not in text
    for tag, attrs in page.tags:
        assert tag not in ("script", "link", "iframe"), tag
        for key in ("src", "href"):
            value = attrs.get(key)
            if value is not None:
                assert value.startswith("data:image/png;base64,"), (tag, value[:40])
    return page


def images(page: _Checker) -> list[str]:
    return [a["src"] or "" for t, a in page.tags if t == "img"]


def test_one_run_report_is_self_contained(runs, tmp_path):
    out = render_report([runs["ep8"]], tmp_path / "r.html")
    text = out.read_text(encoding="utf-8")
    page = check_page(text)
    imgs = images(page)
    # latency CDFs + every time-series panel but the two storage ones (no store in this run)
    assert len(imgs) == 1 + len(PANELS) - 2
    assert all(src.startswith("data:image/png;base64,iVBOR") for src in imgs)
    labels = (
        "TTFT p99",
        "TPOT mean",
        "ITL p90",
        "E2E p50",
        "output tok / s",
        "share of completed within SLOs",
        "$ / hour",
        "$ / M output tokens",
        "revenue $ / GPU-hour",
        "token hit rate",
        "decode imbalance (mean)",
    )
    for label in labels:
        assert f"<td>{label}</td>" in text, label
    assert "KV storage" not in text  # no store, no storage rows or panels
    assert "Δ" not in text  # nothing to compare with
    summary = json.loads((runs["ep8"] / "summary.json").read_text())
    assert f"{summary['latency']['ttft_s']['p99'] * 1e3:,.4g} ms" in text


def test_two_runs_side_by_side_with_deltas(runs, tmp_path):
    out = render_report([runs["ep8"], runs["ep16-store"]], tmp_path / "cmp.html")
    text = out.read_text(encoding="utf-8")
    page = check_page(text)
    titles = {title for title, _, _ in PANELS}
    assert len(images(page)) == 1 + len(titles)  # the store adds both storage panels
    assert "Δ vs ep8" in text and "<th>ep16-store</th>" in text
    # GPUs 12 -> 20: +8 (+66.7 %), and a better (lower) TPOT with twice the decode ranks
    gpus = r'<td>GPUs</td><td>12</td><td>20</td><td class="same">\+8 \(\+66\.7 %\)'
    assert re.search(gpus, text)
    row = re.search(r"<td>TPOT p50</td>.*?</tr>", text)
    assert row and 'class="better"' in row.group(0) and "%)" in row.group(0)
    assert "<td>peak read GB/s</td>" in text and "<td>used (peak)</td>" in text
    assert text.count('class="better"') + text.count('class="worse"') > 5


def test_text_from_the_runs_is_escaped(runs, tmp_path):
    odd = tmp_path / "<b>run & co</b>"
    shutil.copytree(runs["ep8"], odd)
    text = render_report([odd], tmp_path / "r.html").read_text(encoding="utf-8")
    assert "&lt;b&gt;run &amp; co&lt;/b&gt;" in text and "<b>" not in text
    check_page(text)


def test_a_run_without_its_tables_still_reports_its_summary(runs, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(runs["ep8"] / "summary.json", bare / "summary.json")
    text = render_report([bare], tmp_path / "r.html").read_text(encoding="utf-8")
    page = check_page(text)
    assert images(page) == []
    assert "No requests.parquet" in text and "No timeseries.parquet" in text
    assert "<td>TTFT p99</td>" in text


def test_missing_run_folder_or_summary_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such run folder"):
        render_report([tmp_path / "nope"], tmp_path / "r.html")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no summary\.json"):
        render_report([tmp_path / "empty"], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_report_command_default_outputs(runs, tmp_path, monkeypatch):
    one = tmp_path / "one"
    shutil.copytree(runs["ep8"], one)
    res = CliRunner().invoke(report, [str(one)])
    assert res.exit_code == 0, res.output
    assert (one / "report.html").is_file() and "wrote" in res.output
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(report, [str(runs["ep8"]), str(runs["ep16-store"])])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "report.html").is_file()
    res = CliRunner().invoke(report, [str(runs["ep8"]), "--out", str(tmp_path / "x" / "y.html")])
    assert res.exit_code == 0 and (tmp_path / "x" / "y.html").is_file()


@pytest.mark.parametrize(
    ("name", "message"), [("nope", "no such run folder"), ("empty", "no summary.json")]
)
def test_report_command_errors_are_one_line_and_exit_2(tmp_path, name, message):
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(report, [str(tmp_path / name)])
    assert res.exit_code == 2
    assert message in res.output and res.output.count("error:") == 1
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def test_the_page_renders_in_a_headless_browser(runs, tmp_path):
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        pytest.skip(f"no headless browser on PATH (looked for {', '.join(BROWSERS)})")
    page = render_report([runs["ep8"], runs["ep16-store"]], tmp_path / "r.html")
    shot = tmp_path / "shot.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [browser, *flags, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Δ vs ep8" in dom.stdout and dom.stdout.count("data:image/png;base64,") == 1 + len(
        PANELS
    )
    rendered = subprocess.run(
        [browser, *flags, f"--screenshot={shot}", "--window-size=1400,2400", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    assert rendered.returncode == 0 and shot.stat().st_size > 10_000
