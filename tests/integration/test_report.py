"""What-if reports: one HTML page that needs nothing but a browser.

Every figure is an inline PNG, the page loads no URL, every piece of text from a run is escaped,
and with two runs the summary shows the second against the first, absolute and in percent. The
page opens with a headline (SLOs met at this load, the binding pool, its headroom), then cost,
then the detail; a change is coloured better or worse only between runs offered the same load.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from conftest import tiny_dict

from deepinfer_sim.cli import main
from deepinfer_sim.cli_plan import report
from deepinfer_sim.errors import UserError
from deepinfer_sim.scenario import scenario_from_dict
from deepinfer_sim.sim.results import report_figures
from deepinfer_sim.sim.results.report import load_run, render_report
from deepinfer_sim.sim.results.report_figures import MAX_POINTS, PANELS, downsample
from deepinfer_sim.sim.results.report_numbers import (
    delta,
    fmt,
    headline,
    percent_number,
    same_offered_load,
)
from deepinfer_sim.sim.run import simulate


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Tiny runs: EP8 decode with the reference prefix store, EP16 with a 3FS store (both
    offered the same load); EP8 offered twice the load; and EP8 run through the CLI with a
    TPOT SLO no deployment meets (``--set slo.tpot_s=0.0001``)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, over in (
        ("ep8", {}),
        ("ep16-store", {"pools.decode.ep": 16, "pools.storage.nodes": 24}),
        ("ep8-2x", {"workload.rate_scale": 2.0}),
    ):
        sc = scenario_from_dict(tiny_dict(**{"workload.max_requests": 80, **over}))
        out[name] = simulate(sc).write(root / name, plots=False)
    config = root / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_dict(**{"workload.max_requests": 80})))
    miss = root / "tight-slo"
    args = ["run", str(config), "--out", str(miss), "--no-plots", "-q"]
    res = CliRunner().invoke(main, [*args, "--set", "slo.tpot_s=0.0001"])
    assert res.exit_code == 0, res.output
    out["tight-slo"] = miss
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
    headline_at, cost_at, detail_at = (text.index(f'<section id="{s}">') for s in SECTIONS)
    assert headline_at < cost_at < detail_at
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


SECTIONS = ("headline", "cost", "summary")


def _card(text: str, n: int) -> str:
    found = re.search(rf'<div class="card (\w+)" id="headline-{n}">.*?</div>', text, re.S)
    assert found, f"no headline card {n}"
    return found.group(0)


def test_the_headline_says_whether_the_slos_are_met_which_pool_binds_and_the_headroom(
    runs, tmp_path
):
    """The tiny run meets the default SLOs; the same deployment with a 0.1 ms TPOT SLO misses
    it, and the card says by how much. Both name the binding pool and its headroom."""
    text = render_report([runs["ep8"], runs["tight-slo"]], tmp_path / "r.html").read_text()
    check_page(text)
    summary = json.loads((runs["ep8"] / "summary.json").read_text())
    offered = summary["offered_load"]["offered"]["request_per_s"]
    meets, misses = _card(text, 1), _card(text, 2)
    assert 'class="card meets"' in meets and "Meets its SLOs at" in meets
    assert "Misses" not in meets
    assert 'class="card misses"' in misses
    p99 = json.loads((runs["tight-slo"] / "summary.json").read_text())["latency"]["tpot_s"]["p99"]
    assert f"Misses its SLOs at {offered:.4g} requests/s offered: p99 TPOT" in misses
    assert f"{p99 * 1e3:.3g} ms &gt; 100 µs" in misses
    h = headline(summary, {"ttft_s": 5.0, "tpot_s": 0.05})
    binding = h.binding
    assert binding is not None and h.headroom is not None
    assert f"Binding pool: {binding.pool}</strong>" in meets and "headroom" in meets


def test_the_binding_pool_is_decode_by_occupancy_and_prefill_by_busy_time():
    """Decode reads ~100 % busy at any load, so it binds by its batch or KV fill."""
    summary = {
        "requests": {"rejected": 0, "in_flight": 0},
        "latency": {"ttft_s": {"p99": 1.0}, "tpot_s": {"p99": 0.02}},
        "load": {
            "prefill": {"busy_fraction": 0.4, "step_token_fill": 0.1},
            "decode": {"busy_fraction": 1.0, "batch_fill": 0.7, "kv_reserved_fraction_mean": 0.2},
        },
    }
    h = headline(summary, {"ttft_s": 5.0, "tpot_s": 0.05})
    assert h.meets and h.binding is not None
    assert (h.binding.pool, h.binding.measure) == ("decode", "batch slots")
    assert h.headroom == pytest.approx(0.3)
    summary["load"]["prefill"]["busy_fraction"] = 0.9
    h = headline(summary, {"ttft_s": 5.0, "tpot_s": 0.05})
    assert h.binding is not None and h.binding.pool == "prefill"
    assert h.headroom == pytest.approx(0.1)
    # p99 TTFT over its limit, a rejected request, min_user_tok_s tightening the TPOT limit
    summary["requests"]["rejected"] = 1
    h = headline(summary, {"ttft_s": 0.5, "tpot_s": 0.05, "min_user_tok_s": 100})
    assert [c.name for c in h.missed] == ["p99 TTFT", "p99 TPOT", "requests not served"]


def test_two_runs_side_by_side_with_deltas(runs, tmp_path):
    out = render_report([runs["ep8"], runs["ep16-store"]], tmp_path / "cmp.html")
    text = out.read_text(encoding="utf-8")
    page = check_page(text)
    assert len(images(page)) == 1 + len(PANELS)  # the store adds both storage panels
    assert "Δ vs ep8" in text and "<th>ep16-store</th>" in text
    # GPUs 12 -> 20: +8 (+66.7 %), and a better (lower) TPOT with twice the decode ranks
    gpus = r'<td>GPUs</td><td>12</td><td>20</td><td class="same">\+8 \(\+66\.7 %\)'
    assert re.search(gpus, text)
    assert "was offered the same load as ep8" in text
    row = re.search(r"<td>TPOT p50</td>.*?</tr>", text)
    assert row and 'class="better"' in row.group(0) and "%)" in row.group(0)
    assert "<td>peak read GB/s</td>" in text and "<td>used (peak)</td>" in text
    assert text.count('class="better"') + text.count('class="worse"') > 5


def test_a_change_under_more_offered_load_is_not_coloured(runs, tmp_path):
    """Twice the traffic gives more throughput; that is the load, not a better deployment."""
    text = render_report([runs["ep8"], runs["ep8-2x"]], tmp_path / "r.html").read_text()
    check_page(text)
    assert "Offered load differs: ep8-2x" in text
    row = re.search(r"<td>requests / s</td>.*?</tr>", text)
    assert row and "+" in row.group(0) and 'class="same"' in row.group(0)
    assert 'class="better"' not in text and 'class="worse"' not in text


def _offered(rps: float, tok: float = 1000.0) -> dict:
    return {
        "offered_load": {
            "offered": {"request_per_s": rps, "input_tok_per_s": tok, "output_tok_per_s": tok}
        }
    }


def test_same_offered_load_decides_whether_changes_are_coloured():
    assert same_offered_load(_offered(10.0), _offered(10.05))  # within 1 %
    assert not same_offered_load(_offered(10.0), _offered(10.5))
    assert not same_offered_load(_offered(10.0), _offered(10.0, tok=2000.0))
    assert not same_offered_load(_offered(10.0), {})  # not recorded: never coloured
    assert delta(10.0, 12.0, "num", +1, colour=True)[1] == "better"
    assert delta(10.0, 12.0, "num", -1, colour=True)[1] == "worse"
    assert delta(10.0, 12.0, "num", +1, colour=False) == ("+2 (+20.0 %)", "same")
    assert delta(100.0, 100.05, "num", +1, colour=True)[1] == "same"  # +0.05 %: noise


def test_small_percentages_keep_two_significant_figures():
    """A store 0.0048 % full is not 0.00 %, and its change reads in the same precision."""
    assert fmt(4.8e-5, "pct") == "0.0048 %"
    assert fmt(0.0072, "pct") == "0.72 %"
    assert fmt(0.9997, "pct") == "99.97 %"
    assert fmt(1.0, "pct") == "100 %" and fmt(0.0, "pct") == "0 %"
    assert percent_number(1.234e-7) == "0.000012"
    assert delta(4.75e-5, 1.9e-4, "pct", 0) == ("+0.014 pp (+300.0 %)", "same")


def test_prefix_hit_rate_is_nan_where_no_prompt_was_looked_up(runs):
    """An interval without a new arrival looks nothing up: no hit rate (a gap), not 0 %."""
    ts = pd.read_parquet(runs["ep8"] / "timeseries.parquet")
    new = ts["arrived"].diff().fillna(ts["arrived"]) > 0
    assert (~new).sum() > 0 and new.sum() > 0  # the drain after the last arrival, and before
    assert ts.loc[~new, "prefix_hit_rate"].isna().all()
    assert ts.loc[new, "prefix_hit_rate"].notna().all()


def test_downsampling_bounds_the_points_and_keeps_means_peaks_and_gaps():
    n = 16_854
    t = np.arange(1, n + 1, dtype=float)
    y = np.sin(t / 50.0) + (t == 777) * 10.0
    y[5000:5400] = np.nan  # a stretch without data
    b = downsample(t, y)
    assert b.per_bin == -(-n // MAX_POINTS) and b.t.size <= MAX_POINTS
    assert b.t.size == b.mean.size == b.lo.size == b.hi.size
    assert np.nanmax(b.hi) == pytest.approx(np.nanmax(y))  # the spike survives in the band
    assert np.isnan(b.mean).any()  # bins wholly inside the gap stay gaps
    full = ~np.isnan(b.mean)
    assert np.all(b.lo[full] <= b.mean[full]) and np.all(b.mean[full] <= b.hi[full])
    short = downsample(t[:100], y[:100])
    assert short.per_bin == 1 and np.array_equal(short.mean, y[:100])


def _figures(monkeypatch) -> list:
    kept: list = []

    def keep(fig):
        kept.append(fig)
        return "iVBOR"

    monkeypatch.setattr(report_figures, "png", keep)
    return kept


def test_long_time_series_are_drawn_downsampled(runs, monkeypatch):
    """16,854 samples reach the panels as at most MAX_POINTS points per line."""
    run = load_run(runs["ep8"])
    n = 16_854
    run.timeseries = pd.DataFrame(
        {"t_s": np.arange(1, n + 1) * 0.5, "output_tok_per_s": np.random.default_rng(0).random(n)}
    )
    figs = _figures(monkeypatch)
    drawn = report_figures.timeseries_figures([run])
    assert [panel.title for panel, _ in drawn] == ["Output tokens / s"]
    lines = figs[0].axes[0].get_lines()
    assert lines and all(0 < len(line.get_xdata()) <= MAX_POINTS for line in lines)
    assert "mean over 85 samples" in report_figures.bin_note([run])


def test_latency_cdfs_draw_the_slos_on_readable_axes(runs, monkeypatch):
    """The TTFT and TPOT panels carry their SLO as a vertical line inside the axis, and every
    panel has several labelled ticks."""
    figs = _figures(monkeypatch)
    assert report_figures.latency_figure([load_run(runs["ep8"])]) is not None
    ttft, tpot, _e2e = figs[0].axes
    for ax, slo in ((ttft, 5.0), (tpot, 0.05)):
        verticals = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == [slo, slo]]
        assert verticals, ax.get_title()
        lo, hi = ax.get_xlim()
        assert lo < slo < hi
        figs[0].canvas.draw()
        labels = [
            t.get_text()
            for t in ax.get_xticklabels()
            if t.get_text() and lo <= t.get_position()[0] <= hi
        ]
        assert len(labels) >= 3, (ax.get_title(), labels)


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


HANG_S = 600  # a browser that hangs fails the test instead of stalling CI (not a speed limit)
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
        "--disable-quic",
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
        timeout=HANG_S,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Δ vs ep8" in dom.stdout and "Meets its SLOs" in dom.stdout
    assert dom.stdout.count("data:image/png;base64,") == 1 + len(PANELS)
    rendered = subprocess.run(
        [browser, *flags, f"--screenshot={shot}", "--window-size=1400,2400", page.as_uri()],
        capture_output=True,
        timeout=HANG_S,
    )
    assert rendered.returncode == 0 and shot.stat().st_size > 10_000
