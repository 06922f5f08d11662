"""What-if reports: one self-contained HTML page for one run, or several runs side by side.

The page needs nothing but a browser: styles are inline, figures are PNGs embedded as
``data:image/png;base64`` (matplotlib, Agg backend), and it references no URL, so it can be
mailed, attached to a ticket or opened offline.

It reads top-down, the way the question is asked. First a headline per run: does the deployment
meet its SLOs at the load it was offered, which pool binds and how much headroom that leaves
(``report_numbers.py`` says how each is decided). Then cost: GPUs, $ per hour and per million
output tokens, revenue. Then the detail: the summary in vLLM-bench vocabulary as a grid of small
tables, latency CDFs with the SLOs drawn on them, and downsampled time series
(``report_figures.py``); last the run folders and their resolved configurations. With two runs or
more every table has one column per run and, for each run after the first, its change against the
first, coloured better or worse only when the two were offered the same load.

Cost per token and revenue per GPU-hour of a run that did not keep up with its load or missed its
SLOs carry a caveat (a dagger on the cell and a note saying what they mean at that load), and
their changes are not coloured: a saturated deployment looks cheap per token.

No table may overlap another at any width: the detail grid's columns are as wide as the number
of runs needs (three runs or more stack the tables in one column), column headings (run names)
and folder paths wrap, and every table sits in a box that scrolls sideways when the page is still
narrower than the table.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ...errors import UserError
from .report_figures import bin_note, latency_figure, timeseries_figures, with_derived_columns
from .report_numbers import (
    CAVEATED_COSTS,
    COST_METRICS,
    DETAIL_METRICS,
    HEADROOM_SHOWN_FROM,
    OFFERED_TOLERANCE,
    Headline,
    Metric,
    backlog_text,
    cost_caveat,
    delta,
    describe,
    fmt,
    get,
    headline,
    headroom_text,
    offered_load,
    same_offered_load,
    seconds,
    short_pct,
    verdict,
)


@dataclass
class RunData:
    path: Path
    label: str
    summary: dict[str, Any]
    requests: pd.DataFrame | None
    timeseries: pd.DataFrame | None
    config: str | None
    slo: dict[str, Any]  # the resolved config's ``slo`` section (else summary's goodput.slo)


def _read_parquet(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        return pd.read_parquet(path)
    except Exception as exc:
        raise UserError(f"{path}: cannot read: {type(exc).__name__}: {exc}") from None


def load_run(path: str | Path) -> RunData:
    """Read a run folder. Only ``summary.json`` is required; the parquet files add figures."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{p}: no such run folder")
    summary_file = p / "summary.json"
    if not summary_file.is_file():
        raise UserError(f"{p}: no summary.json (not a run folder? `deepinfer-sim run` writes one)")
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserError(f"{summary_file}: not valid JSON: {exc}") from None
    if not isinstance(summary, dict):
        raise UserError(f"{summary_file}: expected a JSON object")
    cfg = p / "config.resolved.yaml"
    config = cfg.read_text(encoding="utf-8") if cfg.is_file() else None
    ts = _read_parquet(p / "timeseries.parquet")
    return RunData(
        path=p,
        label=p.resolve().name or str(p),
        summary=summary,
        requests=_read_parquet(p / "requests.parquet"),
        timeseries=None if ts is None else with_derived_columns(ts, summary),
        config=config,
        slo=_slo(config, summary),
    )


def _slo(config: str | None, summary: dict[str, Any]) -> dict[str, Any]:
    if config is not None:
        try:
            section = (yaml.safe_load(config) or {}).get("slo")
        except (yaml.YAMLError, AttributeError):
            section = None
        if isinstance(section, dict):
            return section
    applied = get(summary, ("goodput", "slo"))
    return applied if isinstance(applied, dict) else {}


def _unique_labels(runs: list[RunData]) -> None:
    labels = [r.label for r in runs]
    for i, r in enumerate(runs):
        if labels.count(r.label) > 1:
            parent = r.path.resolve().parent.name
            r.label = f"{parent}/{r.label}" if parent else f"{r.label} ({i + 1})"
    seen: dict[str, int] = {}
    for r in runs:  # still equal (the same folder twice): number them
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            r.label = f"{r.label} ({seen[r.label]})"


# ---- HTML ---------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1500px;padding:1rem 2rem;color:#1d1d1f;background:#fff;line-height:1.4}
h1{font-size:1.45rem;margin:.2rem 0}h2{font-size:1.15rem;margin:1.8rem 0 .6rem;
border-bottom:1px solid #ddd;padding-bottom:.2rem}h3{font-size:1rem;margin:0 0 .4rem}
.meta{color:#666;font-size:.85rem;margin:.3rem 0}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,34rem),1fr));gap:1rem}
.card{border:1px solid #ddd;border-left:6px solid #888;border-radius:6px;padding:.8rem 1rem;
min-width:0;overflow-x:auto}
.card.meets{border-left-color:#137333}.card.misses{border-left-color:#b3261e}
.verdict{font-size:1.15rem;font-weight:600;margin:.1rem 0 .5rem}
.meets .verdict{color:#137333}.misses .verdict{color:#b3261e}
.card p{margin:.35rem 0;font-size:.92rem}
.warn{border-left:4px solid #b26a00;background:#fff8e6;padding:.35rem .6rem;font-size:.92rem;
margin:.4rem 0}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,22rem),1fr));
gap:.4rem 1.5rem;align-items:start}
.grid.wide{grid-template-columns:repeat(auto-fill,minmax(min(100%,34rem),1fr))}
.grid.stack{grid-template-columns:minmax(0,1fr)}.grid.stack table{width:auto;min-width:60%}
.grid>div,.box{min-width:0;overflow-x:auto}
.narrow table{width:auto;min-width:min(100%,28rem)}
table{border-collapse:collapse;font-size:.85rem;margin:.3rem 0;width:100%}
caption{text-align:left;font-weight:600;padding:.3rem 0}
th,td{padding:.2rem .5rem;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
thead th{background:#f5f5f7;white-space:normal;overflow-wrap:anywhere;vertical-align:bottom}
td code{white-space:normal;overflow-wrap:anywhere}
td.better{color:#137333;font-weight:600}td.worse{color:#b3261e;font-weight:600}
td.same,td.na{color:#777}
td.ok{color:#137333}td.miss{color:#b3261e;font-weight:600}
td.caveat{color:#b26a00}
.grid>.tall{grid-row:span 2}.grid.stack>.tall{grid-row:auto}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,400px),1fr));gap:.8rem}
figure{margin:0}figure img{width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.8rem;color:#555}
details{margin:.4rem 0}pre{background:#f5f5f7;padding:.6rem;overflow:auto;font-size:.75rem;
max-height:30rem}
code{font-size:.85rem}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _img(b64: str, alt: str, caption: str = "") -> str:
    cap = f"<figcaption>{_e(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="data:image/png;base64,{b64}" alt="{_e(alt)}">{cap}</figure>'


# ---- headline and cost --------------------------------------------------------------------------


def _slo_table(h: Headline) -> str:
    rows = []
    for c in h.checks:
        if c.kind == "n":
            measured = "–" if c.measured is None else f"{c.measured:,.0f}"
            limit, use = "0", ""
        else:
            measured = "–" if c.measured is None else seconds(c.measured)
            limit = f"≤ {seconds(c.limit)}"
            use = "" if c.measured is None else short_pct(c.use)
        cls = "ok" if c.met else "miss"
        mark = "met" if c.met else "missed"
        rows.append(
            f"<tr><td>{_e(c.name)}</td><td>{_e(measured)}</td><td>{_e(limit)}</td>"
            f'<td>{_e(use)}</td><td class="{cls}">{mark}</td></tr>'
        )
    head = "<tr><th>SLO</th><th>measured</th><th>limit</th><th>of limit</th><th></th></tr>"
    return f'<table class="slo"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _headline_card(r: RunData, i: int) -> str:
    h = headline(r.summary, r.slo)
    cls = "meets" if h.meets else "misses"
    mark = "✔" if h.meets else "✘"
    parts = [
        f'<div class="card {cls}" id="headline-{i + 1}">',
        f"<h3>{_e(r.label)}</h3>",
        f'<p class="verdict">{mark} {_e(verdict(h))}</p>',
    ]
    if h.backlog is not None:
        parts.append(f'<p class="warn">{_e(backlog_text(h))}</p>')
        busy = next((p for p in h.pools if p.pool == h.backlog.stage), None)
        averaged = (
            f", {short_pct(busy.fraction)} {'busy' if busy.measure == 'busy' else 'full'} "
            "on average over the run (the drain included)"
            if busy is not None
            else ""
        )
        parts.append(
            f"<p><strong>Binding pool: {_e(h.backlog.stage)}</strong>, where the queue grew"
            f"{_e(averaged)}: <strong>no headroom</strong> at this load.</p>"
        )
    binding = h.binding
    if h.backlog is None and binding is not None and h.headroom is not None:
        what = "busy" if binding.measure == "busy" else f"full ({binding.measure})"
        used, room = short_pct(binding.fraction), headroom_text(h.headroom)
        room = "no headroom" if room == "none" else f"headroom {room}"
        after = (
            "before it saturates (latency SLOs can bind sooner)"
            if h.headroom >= HEADROOM_SHOWN_FROM
            else "(it is saturated)"
        )
        parts.append(
            f"<p><strong>Binding pool: {_e(binding.pool)}</strong>, {_e(used)} {_e(what)}: "
            f"<strong>{_e(room)}</strong> {_e(after)}.</p>"
        )
    tight = h.tightest
    if tight is not None and tight.measured is not None and h.meets:
        parts.append(
            f"<p>Tightest SLO: {_e(tight.name)} at {_e(short_pct(tight.use))} of its limit "
            f"({_e(describe(tight))}).</p>"
        )
    parts.append(_slo_table(h))
    parts += [f'<p class="meta">{_e(p.pool)}: {_e(p.detail)}</p>' for p in h.pools]
    parts.append("</div>")
    return "".join(parts)


def _offered_note(runs: list[RunData]) -> str:
    """Which comparisons are coloured, and why the others are not."""
    first = runs[0]
    notes = []
    for r in runs[1:]:
        a, b = offered_load(first.summary), offered_load(r.summary)
        if same_offered_load(first.summary, r.summary):
            notes.append(
                f"{r.label} was offered the same load as {first.label} (within "
                f"{OFFERED_TOLERANCE:.0%}): its changes are coloured, green better, red worse."
            )
        elif a is None or b is None:
            notes.append(f"{r.label}: offered load not recorded, so its changes are not coloured.")
        else:
            notes.append(
                f"Offered load differs: {r.label} {fmt(b['request_per_s'], 'num')} requests/s "
                f"against {fmt(a['request_per_s'], 'num')} for {first.label}, so its changes "
                "are not coloured (a rise may come from the load, not the deployment)."
            )
    return "".join(f'<p class="meta">{_e(n)}</p>' for n in notes)


# ---- metric tables ------------------------------------------------------------------------------


def _value_cell(v: Any, kind: str, caveat: bool) -> str:
    if caveat and v is not None:
        return f'<td class="caveat">{_e(fmt(v, kind))} †</td>'
    return f"<td>{_e(fmt(v, kind))}</td>"


def _metric_table(
    runs: list[RunData],
    metrics: list[Metric],
    colour: list[bool],
    caption: str = "",
    caveat: Sequence[bool] = (),
) -> str:
    """One row per metric any run has; a run after the first adds its column and its Δ. A run
    whose ``caveat`` is set has its ``CAVEATED_COSTS`` cells marked † (the note below the table
    says why), and their changes against the first run are not coloured when either is marked."""
    marked = list(caveat) or [False] * len(runs)
    first = runs[0]
    head = ["<th>metric</th>", f"<th>{_e(first.label)}</th>"]
    for r in runs[1:]:
        head += [f"<th>{_e(r.label)}</th>", f"<th>Δ vs {_e(first.label)}</th>"]
    body: list[str] = []
    for _sec, label, path, kind, better in metrics:
        values = [get(r.summary, path) for r in runs]
        if all(v is None for v in values):
            continue  # e.g. storage rows of runs without a KV store
        pool_count = path[:2] == ("cost", "gpus") or path == ("cost", "storage_nodes")
        if pool_count and path[-1] != "total" and not any(values):
            continue  # a pool no run has
        caveated = path[0] == "cost" and path[-1] in CAVEATED_COSTS
        cells = [f"<td>{_e(label)}</td>", _value_cell(values[0], kind, caveated and marked[0])]
        for k, (v, coloured) in enumerate(zip(values[1:], colour, strict=True), start=1):
            plain = caveated and (marked[0] or marked[k])
            text, cls = delta(values[0], v, kind, better, coloured and not plain)
            mark = caveated and marked[k]
            cells += [_value_cell(v, kind, mark), f'<td class="{cls}">{_e(text)}</td>']
        body.append(f"<tr>{''.join(cells)}</tr>")
    if not body:
        return ""
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return (
        f'<table class="metrics">{cap}<thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _detail_tables(runs: list[RunData], colour: list[bool]) -> str:
    sections: dict[str, list[Metric]] = {}
    for m in DETAIL_METRICS:
        sections.setdefault(m[0], []).append(m)
    cells = []
    for sec, rows in sections.items():
        table = _metric_table(runs, rows, colour, sec)
        if table:  # the long latency table beside two short ones, not above a gap
            cells.append(
                f'<div class="tall">{table}</div>' if sec == "Latency" else f"<div>{table}</div>"
            )
    # columns as wide as the tables need: a metric, a value per run and a Δ per later run
    layout = "" if len(runs) == 1 else " wide" if len(runs) == 2 else " stack"
    return f'<div class="grid{layout}">' + "".join(cells) + "</div>"


def _cost_section(runs: list[RunData], colour: list[bool]) -> str:
    """The cost table, then a caveat for each run whose per-token figures flatter it."""
    notes = [cost_caveat(r.summary, headline(r.summary, r.slo)) for r in runs]
    table = _metric_table(runs, COST_METRICS, colour, caveat=[n is not None for n in notes])
    parts = [f'<div class="narrow box">{table}</div>']
    for i, (r, note) in enumerate(zip(runs, notes, strict=True)):
        if note is not None:
            who = f"{r.label}: " if len(runs) > 1 else ""
            parts.append(f'<p class="warn" id="cost-caveat-{i + 1}">† {_e(who + note)}</p>')
    return "".join(parts)


def _runs_table(runs: list[RunData]) -> str:
    rows = []
    for r in runs:
        s = r.summary
        files = [n for n in ("requests.parquet", "timeseries.parquet") if (r.path / n).is_file()]
        rows.append(
            "<tr>"
            f"<td>{_e(r.label)}</td><td>{_e(s.get('scenario', '–'))}</td>"
            f"<td>{_e(fmt(get(s, ('requests', 'arrived')), 'int'))}</td>"
            f"<td>{_e(fmt(get(s, ('sim', 'simulated_s')), 'num'))}</td>"
            f"<td><code>{_e(r.path)}</code></td><td>{_e(', '.join(files) or '–')}</td>"
            "</tr>"
        )
    head = (
        "<tr><th>run</th><th>scenario</th><th>requests</th><th>simulated s</th>"
        "<th>folder</th><th>tables</th></tr>"
    )
    return (
        f'<div class="box"><table><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>'
    )


# ---- the page -----------------------------------------------------------------------------------


def build_html(runs: list[RunData]) -> str:
    title = (
        f"deepinfer-sim report: {runs[0].label}"
        if len(runs) == 1
        else f"deepinfer-sim report: {len(runs)} runs compared with {runs[0].label}"
    )
    colour = [same_offered_load(runs[0].summary, r.summary) for r in runs[1:]]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{CSS}</style>",
        "</head>",
        "<body>",
        f"<header><h1>{_e(title)}</h1>",
        f'<p class="meta">generated {_e(datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"))}'
        " by deepinfer-sim; self-contained (no external resources)</p></header>",
        '<section id="headline"><h2>Headline</h2>',
        '<div class="cards">',
        *(_headline_card(r, i) for i, r in enumerate(runs)),
        "</div>",
    ]
    if len(runs) > 1:
        parts.append(_offered_note(runs))
    parts += [
        "</section>",
        '<section id="cost"><h2>Cost</h2>',
        _cost_section(runs, colour),
        "</section>",
        '<section id="summary"><h2>Detail</h2>',
    ]
    if len(runs) > 1:
        parts.append(
            '<p class="meta">Δ: change against the first run, absolute and in percent '
            "(pp: percentage points).</p>"
        )
    parts += [_detail_tables(runs, colour), "</section>"]

    parts.append('<section id="latency"><h2>Latency distributions</h2>')
    cdf = latency_figure(runs)
    if cdf is None:
        parts.append('<p class="meta">No requests.parquet in these runs.</p>')
    else:
        caption = "Dashed red: the SLO; dotted: the p99 level, which the planner holds to it."
        if len(runs) == 1:
            caption += " One line per traffic class when there are a few."
        parts.append(_img(cdf, "latency CDFs: TTFT, TPOT, E2E", caption))
    parts.append("</section>")

    parts.append('<section id="timeseries"><h2>Over time</h2>')
    figs = timeseries_figures(runs)
    if not figs:
        parts.append('<p class="meta">No timeseries.parquet in these runs.</p>')
    else:
        parts.append(f'<p class="meta">{_e(bin_note(runs))}</p>')
        parts.append('<div class="figs">')
        parts += [_img(b64, panel.title, panel.note) for panel, b64 in figs]
        parts.append("</div>")
    parts.append("</section>")

    parts.append('<section id="runs"><h2>Runs</h2>')
    parts.append(_runs_table(runs))
    for r in runs:
        if r.config:
            parts.append(
                f"<details><summary>{_e(r.label)}: resolved configuration</summary>"
                f"<pre>{_e(r.config)}</pre></details>"
            )
    parts += ["</section>", "</body>", "</html>", ""]
    return "\n".join(parts)


def render_report(run_dirs: Sequence[str | Path], out_html: str | Path) -> Path:
    """Write one self-contained HTML page for ``run_dirs`` (the first is the reference when
    there are several). Raises UserError for a missing folder or summary.json."""
    if not run_dirs:
        raise UserError("no run folders given")
    runs = [load_run(d) for d in run_dirs]
    _unique_labels(runs)
    text = build_html(runs)
    out = Path(out_html)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out
