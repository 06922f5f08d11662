"""What-if reports: one HTML page that needs nothing but a browser.

Every figure is an inline PNG, the page loads no URL, every piece of text from a run is escaped,
and with two runs the summary shows the second against the first, absolute and in percent. The
page opens with a headline (SLOs met at this load, the binding pool, its headroom), then cost,
then the detail; a change is coloured better or worse only between runs offered the same load.
Numbers compare like with like (requests served of requests offered), a run that did not keep
up with its load has its cost per token flagged, and the page is checked in a real browser: at
1400 and 1920 px no table overlaps another.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape
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
    BACKLOG_MIN,
    BACKLOG_SHARE,
    cost_caveat,
    delta,
    fmt,
    headline,
    headroom_text,
    percent_number,
    same_offered_load,
)
from deepinfer_sim.sim.run import simulate


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Tiny runs: EP8 decode with the reference prefix store, EP16 with a 3FS store (both
    offered the same load); EP8 offered twice the load, and twenty times (more than its prefill
    serves: the backlog grows, yet the 80 requests drain within the SLOs); and EP8 run through
    the CLI with a TPOT SLO no deployment meets (``--set slo.tpot_s=0.0001``)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, over in (
        ("ep8", {}),
        ("ep16-store", {"pools.decode.ep": 16, "pools.storage.nodes": 24}),
        ("ep8-2x", {"workload.rate_scale": 2.0}),
        ("ep8-20x", {"workload.rate_scale": 20.0}),
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
    # GPUs 12 -> 20: +8 (+66.7 %); TPOT marked better where it fell, worse where it rose
    gpus = r'<td>GPUs</td><td>12</td><td>20</td><td class="same">\+8 \(\+66\.7 %\)'
    assert re.search(gpus, text)
    assert "was offered the same load as ep8" in text
    row = re.search(r"<td>TPOT p50</td><td>([\d.]+) ms</td><td>([\d.]+) ms</td>.*?</tr>", text)
    assert row and "%)" in row.group(0)
    base, other = float(row.group(1)), float(row.group(2))
    assert base != other
    assert f'class="{"better" if other < base else "worse"}"' in row.group(0)
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


def _row(text: str, label: str) -> str:
    found = re.search(rf"<td>{re.escape(label)}</td>.*?</tr>", text)
    assert found, f"no row {label!r}"
    return found.group(0)


def test_served_over_offered_counts_requests_so_a_run_that_served_all_reads_100_percent(
    runs, tmp_path
):
    """The summary's ``served_over_offered`` divided completions per second over the completion
    window by arrivals per second over the arrival window. The two windows differ by the spread
    of latencies, so the tiny run that served all 80 of its 80 requests had a ratio of 0.83, and
    the report showed "served / offered 83.44 %". It compares like with like now: requests
    served of requests offered; and the summary's ratio, counted over one window, reads 1."""
    summary = json.loads((runs["ep8"] / "summary.json").read_text())
    assert summary["requests"]["completed"] == summary["requests"]["arrived"] == 80
    assert summary["offered_load"]["served_over_offered"] == 1.0
    text = render_report([runs["ep8"]], tmp_path / "r.html").read_text()
    assert "<td>served / offered requests</td><td>100 %</td>" in _row(
        text, "served / offered requests"
    )


def test_a_saturated_pool_shows_no_meaningless_digits_of_headroom(runs, tmp_path):
    """A prefill pool 99.9996 % busy has no headroom worth a number: the card says "under
    0.01 %" (it is saturated), not 0.00040 %; an exactly full pool has none."""
    assert headroom_text(4e-6) == "under 0.01 %"
    assert headroom_text(0.0) == "none"
    assert headroom_text(0.37) == "37 %" and headroom_text(0.0042) == "0.42 %"
    busy = tmp_path / "busy"
    busy.mkdir()
    summary = json.loads((runs["ep8"] / "summary.json").read_text())
    summary["load"]["prefill"]["busy_fraction"] = 0.999996
    (busy / "summary.json").write_text(json.dumps(summary))
    card = _card(render_report([busy], tmp_path / "r.html").read_text(), 1)
    assert "<strong>headroom under 0.01 %</strong> (it is saturated)" in card
    assert "0.0004" not in card
    summary["load"]["prefill"]["busy_fraction"] = 1.0
    (busy / "summary.json").write_text(json.dumps(summary))
    card = _card(render_report([busy], tmp_path / "r.html").read_text(), 1)
    assert "<strong>no headroom</strong> (it is saturated)" in card


def test_a_run_that_did_not_keep_up_has_its_cost_per_token_flagged(runs, tmp_path):
    """Twenty times the traffic: the prefill queue grows to more than half of the 80 requests,
    and they still drain within the SLOs, so the verdict is "meets". Its $ / M output tokens
    is about a third of the kept-up run's, because it divides the same $ / hour by the tokens of a
    saturated deployment. The headline says it did not keep up, the per-token cost and revenue
    cells carry a dagger and a note says what they mean at that load; the cells that do not
    depend on the load ($ / hour, GPUs) carry none."""
    kept, over = (json.loads((runs[n] / "summary.json").read_text()) for n in ("ep8", "ep8-20x"))
    assert over["load"]["prefill"]["queue"]["max"] >= BACKLOG_SHARE * 80
    assert over["cost"]["usd_per_mtok_output"] < kept["cost"]["usd_per_mtok_output"] / 2
    text = render_report([runs["ep8"], runs["ep8-20x"]], tmp_path / "r.html").read_text()
    check_page(text)
    card = _card(text, 2)
    assert "Meets its SLOs" in card and "It did not keep up with this load" in card
    assert "<strong>no headroom</strong> at this load" in card  # not the busy time's 75 %
    note = re.search(r'<p class="warn" id="cost-caveat-2">(.*?)</p>', text, re.S)
    assert note, "no cost caveat for the overloaded run"
    assert "did not keep up" in note.group(1) and "saturated deployment" in note.group(1)
    assert 'id="cost-caveat-1"' not in text  # the run that kept up has none
    mtok = _row(text, "$ / M output tokens")
    assert mtok.count(" †</td>") == 1 and 'class="caveat"' in mtok
    assert " †" in _row(text, "revenue $ / GPU-hour")
    assert " †" not in _row(text, "$ / hour") and " †" not in _row(text, "GPUs")


def test_cost_caveats_say_why(runs):
    """No caveat for a run that kept up and met its SLOs; "saturated" for one whose backlog
    grew or that left requests unserved; "misses its SLOs" for one that kept up but was too
    slow (a TPOT limit no deployment meets)."""
    slo = {"ttft_s": 5.0, "tpot_s": 0.05}
    kept, over = (json.loads((runs[n] / "summary.json").read_text()) for n in ("ep8", "ep8-20x"))
    assert cost_caveat(kept, headline(kept, slo)) is None
    assert "saturated" in (cost_caveat(over, headline(over, slo)) or "")
    slow = cost_caveat(kept, headline(kept, {"ttft_s": 5.0, "tpot_s": 0.0001}))
    assert slow is not None and "misses its SLOs" in slow and "p99 TPOT" in slow
    rejected = json.loads(json.dumps(kept))
    rejected["requests"]["rejected"] = 3
    h = headline(rejected, slo)
    assert not h.kept_up and "3 requests were not served" in (cost_caveat(rejected, h) or "")
    # a few requests waiting at once is no backlog, in a tiny run or a large one
    few = json.loads(json.dumps(kept))
    few["load"]["prefill"]["queue"]["max"] = BACKLOG_MIN - 1
    assert headline(few, slo).kept_up


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


def test_count_axes_are_whole_requests_and_no_axis_reads_milli(runs, monkeypatch):
    """A queue that holds at most one request is drawn on ticks 0 and 1, not 0 to 1,000m; a
    store read at 0.6 GB/s reads 0.6, not 600m (matplotlib's engineering formatter writes both
    with a milli prefix)."""
    run = load_run(runs["ep8"])
    n = 50
    t = np.arange(1, n + 1) * 0.5
    run.timeseries = pd.DataFrame(
        {
            "t_s": t,
            "prefill_queue": (np.arange(n) % 2).astype(float),
            "decode_waiting": np.zeros(n),
            "storage_read_gbps": np.linspace(0.0, 0.6, n),
        }
    )
    figs = _figures(monkeypatch)
    drawn = report_figures.timeseries_figures([run])
    titles = [panel.title for panel, _ in drawn]
    assert titles == ["Waiting requests", "KV storage reads"]
    for fig, title in zip(figs, titles, strict=True):
        fig.canvas.draw()
        ax = fig.axes[0]
        lo, hi = ax.get_ylim()
        shown = [
            (tick, label.get_text())
            for tick, label in zip(ax.get_yticks(), ax.get_yticklabels(), strict=True)
            if lo <= tick <= hi
        ]
        assert shown and not any(text.endswith("m") for _, text in shown), (title, shown)
        assert all(float(text) == pytest.approx(tick) for tick, text in shown), (title, shown)
        if title == "Waiting requests":
            assert [text for _, text in shown] == ["0", "1"]
    assert report_figures.axis_number(1_200_000) == "1.2M"
    assert report_figures.axis_number(0.5) == "0.5"


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


def _browser() -> str:
    browser = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if browser is None:
        pytest.skip(f"no headless browser on PATH (looked for {', '.join(BROWSERS)})")
    return browser


def _headless(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with a fresh profile and nothing that reaches the network."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=HANG_S)


def test_the_page_renders_in_a_headless_browser(runs, tmp_path):
    browser = _browser()
    page = render_report([runs["ep8"], runs["ep16-store"]], tmp_path / "r.html")
    shot = tmp_path / "shot.png"
    dom = _headless(browser, tmp_path / "profile", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Δ vs ep8" in dom.stdout and "Meets its SLOs" in dom.stdout
    assert dom.stdout.count("data:image/png;base64,") == 1 + len(PANELS)
    rendered = _headless(
        browser,
        tmp_path / "profile",
        f"--screenshot={shot}",
        "--window-size=1400,2400",
        page.as_uri(),
    )
    assert rendered.returncode == 0 and shot.stat().st_size > 10_000


# Measures the laid-out page: each table's box, and the part of it left visible by the boxes
# around it that clip their overflow (a table wider than its box scrolls inside it). Run on a
# copy of the page only: the report itself has no script.
LAYOUT_PROBE = """
(function () {
  function visible(el) {
    var r = el.getBoundingClientRect();
    var box = {left: r.left, top: r.top, right: r.right, bottom: r.bottom};
    for (var p = el.parentElement; p; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== "visible") {
        var q = p.getBoundingClientRect();
        box.left = Math.max(box.left, q.left);
        box.right = Math.min(box.right, q.right);
      }
    }
    return box;
  }
  var tables = Array.prototype.map.call(document.querySelectorAll("table"), function (t, i) {
    var r = t.getBoundingClientRect();
    var title = t.querySelector("caption") || t.querySelector("th");
    return {name: "table " + i + " (" + title.textContent + ")", width: r.width,
            visible: visible(t)};
  });
  var out = document.createElement("pre");
  out.id = "layout-probe";
  out.textContent = JSON.stringify({viewport: document.documentElement.clientWidth,
                                    page: document.documentElement.scrollWidth,
                                    tables: tables});
  document.body.appendChild(out);
})();
"""


def _layout(browser: str, page: Path, width: int, tmp_path: Path) -> dict:
    probe = tmp_path / f"probe-{width}.html"
    text = page.read_text(encoding="utf-8")
    probe.write_text(text.replace("</body>", f"<script>{LAYOUT_PROBE}</script></body>"))
    dom = _headless(
        browser,
        tmp_path / f"profile-{width}",
        f"--window-size={width},2000",
        "--dump-dom",
        probe.as_uri(),
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom.stdout, re.S)
    assert found, "the layout probe did not run"
    return json.loads(unescape(found.group(1)))


def _overlapping(tables: list[dict]) -> list[tuple[str, str]]:
    """Pairs of tables whose visible boxes share more than a pixel's width and height."""
    pairs = []
    for i, a in enumerate(tables):
        for b in tables[i + 1 :]:
            va, vb = a["visible"], b["visible"]
            w = min(va["right"], vb["right"]) - max(va["left"], vb["left"])
            h = min(va["bottom"], vb["bottom"]) - max(va["top"], vb["top"])
            if w > 1 and h > 1:
                pairs.append((a["name"], b["name"]))
    return pairs


@pytest.mark.parametrize("width", [1400, 1920, 760])
def test_three_runs_tables_never_overlap_in_a_browser(runs, tmp_path, width):
    """Three runs make every detail table six columns wide (a metric, three values, two
    changes); with folder names as long as people give them, two such tables side by side are
    wider than the page, and in a fixed grid they ran into each other at 1400 and 1920 px.
    Measured in headless Chromium: at 1400 and 1920 px no table overlaps another, each is shown
    whole, and the page does not scroll sideways; at 760 px the wide tables scroll inside their
    own box instead, still without overlapping."""
    browser = _browser()
    folders = []
    for name, label in (
        ("ep8", "decode-ep8-reference-store"),
        ("ep16-store", "decode-ep16-3fs-store"),
        ("ep8-2x", "decode-ep8-twice-the-load"),
    ):
        folders.append(tmp_path / label)
        shutil.copytree(runs[name], folders[-1])
    page = render_report(folders, tmp_path / "three.html")
    layout = _layout(browser, page, width, tmp_path)
    tables = layout["tables"]
    assert len(tables) > 10  # the three SLO tables, cost, every detail section, runs
    assert _overlapping(tables) == []
    assert layout["page"] <= layout["viewport"], "the page scrolls sideways"
    if width >= 1400:
        clipped = [
            t["name"]
            for t in tables
            if t["visible"]["right"] - t["visible"]["left"] < t["width"] - 1
        ]
        assert clipped == []
