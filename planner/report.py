"""What-if reports: one self-contained HTML page for one run, or several runs side by side.

The page needs nothing but a browser: styles are inline, figures are PNGs embedded as
``data:image/png;base64`` (matplotlib, Agg backend), and it references no URL, so it can be
mailed, attached to a ticket or opened offline.

For each run it shows the summary in vLLM-bench vocabulary (requests; TTFT/TPOT/ITL/E2E mean,
p50, p90, p99; throughput, goodput, utilization; cost per hour, per million output tokens and
revenue per GPU-hour; prefix-cache hit rate; expert imbalance; storage when the run had a KV
store), latency CDFs from ``requests.parquet`` and time series from ``timeseries.parquet``
(panels whose columns the run lacks are left out). With two runs or more the summary has one
column per run and, for each run after the first, its change against the first run, absolute and
in percent, coloured when the change is better or worse.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import UserError

# (section, label, key path in summary.json, unit kind, direction: +1 higher is better,
#  -1 lower is better, 0 neither)
Metric = tuple[str, str, tuple[str, ...], str, int]


def _latency_rows() -> list[Metric]:
    rows: list[Metric] = []
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        for stat in ("mean", "p50", "p90", "p99"):
            rows.append(("Latency", f"{name} {stat}", ("latency", key, stat), "ms", -1))
    return rows


METRICS: list[Metric] = [
    ("Requests", "arrived", ("requests", "arrived"), "int", 0),
    ("Requests", "completed", ("requests", "completed"), "int", +1),
    ("Requests", "rejected", ("requests", "rejected"), "int", -1),
    ("Requests", "in flight at end", ("requests", "in_flight"), "int", -1),
    *_latency_rows(),
    ("Throughput", "requests / s", ("throughput", "request_per_s"), "num", +1),
    ("Throughput", "input tok / s", ("throughput", "input_tok_per_s"), "num", +1),
    ("Throughput", "output tok / s", ("throughput", "output_tok_per_s"), "num", +1),
    ("Throughput", "output tok / s / GPU", ("throughput", "output_tok_per_s_per_gpu"), "num", +1),
    ("Throughput", "makespan (s)", ("throughput", "duration_s"), "num", 0),
    ("Goodput", "requests / s within SLOs", ("goodput", "request_per_s"), "num", +1),
    ("Goodput", "share of completed within SLOs", ("goodput", "fraction_of_completed"), "pct", +1),
    ("Utilization", "prefill", ("utilization", "prefill"), "pct", 0),
    ("Utilization", "decode", ("utilization", "decode"), "pct", 0),
    ("Utilization", "vision", ("utilization", "vision"), "pct", 0),
    ("Cost", "GPUs", ("cost", "gpus", "total"), "int", 0),
    ("Cost", "$ / hour", ("cost", "usd_per_hour"), "usd", -1),
    ("Cost", "$ / M output tokens", ("cost", "usd_per_mtok_output"), "usd", -1),
    ("Cost", "revenue $ / GPU-hour", ("cost", "revenue_per_gpu_hour_usd"), "usd", +1),
    ("Prefix cache", "token hit rate", ("cache", "hit_rate_tokens"), "pct", +1),
    ("Expert balance", "prefill imbalance (mean)", ("eplb", "prefill_imbalance_mean"), "x", -1),
    ("Expert balance", "decode imbalance (mean)", ("eplb", "decode_imbalance_mean"), "x", -1),
    ("KV storage", "nodes", ("storage", "nodes"), "int", 0),
    ("KV storage", "logical capacity (TB)", ("storage", "logical_tb"), "num", 0),
    ("KV storage", "used (end)", ("storage", "used_fraction"), "pct", 0),
    ("KV storage", "used (peak)", ("storage", "used_fraction_peak"), "pct", 0),
    ("KV storage", "peak read GB/s", ("storage", "read_gbps_peak"), "num", 0),
    ("KV storage", "read latency p99", ("storage", "read_latency_s", "p99"), "ms", -1),
    ("KV storage", "lost blocks", ("storage", "lost_blocks"), "int", -1),
    ("Simulation", "seed", ("sim", "seed"), "id", 0),
    ("Simulation", "simulated s", ("sim", "simulated_s"), "num", 0),
    ("Simulation", "events", ("sim", "events"), "int", 0),
    ("Simulation", "wall s", ("sim", "wall_s"), "num", -1),
]

# (panel title, y label, columns); a column a run lacks is skipped, a panel with none is dropped
PANELS: list[tuple[str, str, tuple[str, ...]]] = [
    ("Output tokens", "tokens / s", ("output_tok_per_s",)),
    ("Prefill tokens", "tokens / s", ("prefill_tok_per_s",)),
    (
        "Requests by stage",
        "requests",
        (
            "vision_queue",
            "prefill_queue",
            "transfers_in_flight",
            "decode_waiting",
            "decode_running",
        ),
    ),
    (
        "Utilization",
        "fraction",
        ("vision_util", "prefill_util", "decode_util", "decode_kv_reserved_frac"),
    ),
    ("Prefix hit rate", "fraction of prompt tokens", ("prefix_hit_rate",)),
    ("Expert imbalance", "max / mean load", ("prefill_imbalance", "decode_imbalance")),
    ("KV storage used", "fraction of capacity", ("storage_used_frac",)),
    ("KV storage reads", "GB / s", ("storage_read_gbps",)),
]

CDFS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E latency"))


@dataclass
class RunData:
    path: Path
    label: str
    summary: dict[str, Any]
    requests: pd.DataFrame | None
    timeseries: pd.DataFrame | None
    config: str | None


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
    return RunData(
        path=p,
        label=p.resolve().name or str(p),
        summary=summary,
        requests=_read_parquet(p / "requests.parquet"),
        timeseries=_read_parquet(p / "timeseries.parquet"),
        config=cfg.read_text(encoding="utf-8") if cfg.is_file() else None,
    )


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


# ---- numbers ------------------------------------------------------------------------------------


def _get(summary: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)


def _sig(v: float, digits: int = 4) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    text = f"{v:,.{digits}g}"
    if "e" in text:
        return f"{v:.3e}"
    return text


def fmt(v: Any, kind: str) -> str:
    if v is None:
        return "–"
    if not _is_num(v):
        return str(v)
    if kind == "ms":
        return f"{_sig(v * 1e3)} ms"
    if kind == "pct":
        return f"{v * 100:.2f} %"
    if kind == "usd":
        return f"${v:,.2f}" if abs(v) >= 1 else f"${_sig(v, 3)}"
    if kind in ("int", "id"):
        return f"{v:,}" if kind == "int" else str(v)
    if kind == "x":
        return f"{v:.4f}"
    return _sig(float(v))


def delta(a: Any, b: Any, kind: str, better: int) -> tuple[str, str]:
    """(text, css class) of ``b`` against the reference ``a``."""
    if kind == "id" or not (_is_num(a) and _is_num(b)):
        return "–", "na"
    d = b - a
    if d == 0:
        return "=", "same"
    if kind == "pct":
        absolute = f"{d * 100:+.2f} pp"
    else:
        absolute = fmt(abs(d), kind)
        absolute = ("+" if d > 0 else "−") + absolute
    rel = f" ({d / abs(a) * 100:+.1f} %)" if a != 0 else ""
    cls = "same" if better == 0 else ("better" if d * better > 0 else "worse")
    return absolute + rel, cls


# ---- figures ------------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _finite_positive(values: Any) -> np.ndarray:
    v = np.sort(np.asarray(values, dtype=float))
    return v[np.isfinite(v) & (v > 0)]


def latency_figure(runs: list[RunData]) -> str | None:
    """Latency CDFs (TTFT, TPOT, E2E): per traffic class for one run, one line per run else."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    have = [r for r in runs if r.requests is not None and not r.requests.empty]
    if not have:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (col, title) in zip(axes, CDFS, strict=True):
        for r in have:
            req = r.requests
            assert req is not None
            if col not in req.columns:
                continue
            series: list[tuple[str, Any]] = []
            if len(have) == 1 and "traffic_class" in req.columns:
                classes = pd.unique(req["traffic_class"].dropna())
                if len(classes) > 1:
                    series += [(str(c), req.loc[req["traffic_class"] == c, col]) for c in classes]
                series.append(("all", req[col]))
            else:
                series.append((r.label, req[col]))
            for label, values in series:
                v = _finite_positive(values)
                if v.size:
                    ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"{title} (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    fig.tight_layout()
    return _png(fig)


def timeseries_figures(runs: list[RunData]) -> list[tuple[str, str]]:
    """(title, base64 PNG) per time-series panel that at least one run has data for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    have = [r for r in runs if r.timeseries is not None and not r.timeseries.empty]
    out: list[tuple[str, str]] = []
    styles = ("-", "--", ":", "-.")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for title, ylabel, columns in PANELS:
        lines: list[tuple[Any, Any, str, str, str]] = []
        for i, r in enumerate(have):
            ts = r.timeseries
            assert ts is not None
            if "t_s" not in ts.columns:
                continue
            for j, col in enumerate(columns):
                if col not in ts.columns:
                    continue
                y = pd.to_numeric(ts[col], errors="coerce")
                if y.isna().all() or (col.startswith("vision_") and not y.fillna(0).any()):
                    continue  # missing, or a vision column of a run without a vision pool
                if len(have) == 1:
                    label, color, style = col, colors[len(lines) % len(colors)], "-"
                else:
                    label = f"{r.label}: {col}" if len(columns) > 1 else r.label
                    color, style = colors[i % len(colors)], styles[j % len(styles)]
                lines.append((ts["t_s"], y, label, color, style))
        if not lines:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        for x, y, label, color, style in lines:
            ax.plot(x, y, label=label, color=color, linestyle=style, linewidth=1.2)
        ax.set_title(title)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out.append((title, _png(fig)))
    return out


# ---- HTML ---------------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;
max-width:1400px;padding:1rem 2rem;color:#1d1d1f;background:#fff}
h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;
border-bottom:1px solid #ddd;padding-bottom:.2rem}
.meta{color:#666;font-size:.85rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}
th,td{padding:.25rem .6rem;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}
thead th{background:#f5f5f7;position:sticky;top:0}
tr.section th{background:#fafafa;text-align:left;font-weight:600;padding-top:.6rem}
td.better{color:#137333}td.worse{color:#b3261e}td.same,td.na{color:#888}
.figs{display:flex;flex-wrap:wrap;gap:1rem}
figure{margin:0}figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.8rem;color:#555}
details{margin:.4rem 0}pre{background:#f5f5f7;padding:.6rem;overflow:auto;font-size:.75rem;
max-height:30rem}
code{font-size:.85rem}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _img(b64: str, alt: str, caption: str) -> str:
    return (
        f'<figure><img src="data:image/png;base64,{b64}" alt="{_e(alt)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _runs_table(runs: list[RunData]) -> str:
    rows = []
    for r in runs:
        s = r.summary
        req = s.get("requests") or {}
        files = [n for n in ("requests.parquet", "timeseries.parquet") if (r.path / n).is_file()]
        rows.append(
            "<tr>"
            f"<td>{_e(r.label)}</td><td>{_e(s.get('scenario', '–'))}</td>"
            f"<td>{_e(fmt(req.get('arrived'), 'int'))}</td>"
            f"<td>{_e(fmt(_get(s, ('sim', 'simulated_s')), 'num'))}</td>"
            f"<td><code>{_e(r.path)}</code></td><td>{_e(', '.join(files) or '–')}</td>"
            "</tr>"
        )
    head = (
        "<tr><th>run</th><th>scenario</th><th>requests</th><th>simulated s</th>"
        "<th>folder</th><th>tables</th></tr>"
    )
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _summary_table(runs: list[RunData]) -> str:
    first = runs[0]
    head = ["<th>metric</th>", f"<th>{_e(first.label)}</th>"]
    for r in runs[1:]:
        head += [f"<th>{_e(r.label)}</th>", f"<th>Δ vs {_e(first.label)}</th>"]
    ncols = len(head)
    body: list[str] = []
    section = None
    for sec, label, path, kind, better in METRICS:
        values = [_get(r.summary, path) for r in runs]
        if all(v is None for v in values):
            continue  # e.g. storage rows of runs without a KV store
        if sec != section:
            body.append(f'<tr class="section"><th colspan="{ncols}">{_e(sec)}</th></tr>')
            section = sec
        cells = [f"<td>{_e(label)}</td>", f"<td>{_e(fmt(values[0], kind))}</td>"]
        for v in values[1:]:
            text, cls = delta(values[0], v, kind, better)
            cells += [f"<td>{_e(fmt(v, kind))}</td>", f'<td class="{cls}">{_e(text)}</td>']
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        f'<table class="metrics"><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def build_html(runs: list[RunData]) -> str:
    title = (
        f"deepinfer-sim report: {runs[0].label}"
        if len(runs) == 1
        else f"deepinfer-sim report: {len(runs)} runs compared with {runs[0].label}"
    )
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
        '<section id="runs"><h2>Runs</h2>',
        _runs_table(runs),
        "</section>",
        '<section id="summary"><h2>Summary</h2>',
    ]
    if len(runs) > 1:
        parts.append(
            '<p class="meta">Δ: change against the first run, absolute and in percent '
            "(pp: percentage points); green is better, red worse.</p>"
        )
    parts += [_summary_table(runs), "</section>"]

    parts.append('<section id="latency"><h2>Latency distributions</h2>')
    cdf = latency_figure(runs)
    if cdf is None:
        parts.append('<p class="meta">No requests.parquet in these runs.</p>')
    else:
        caption = "CDFs of TTFT, TPOT and end-to-end latency"
        caption += (
            " (per traffic class when there are several)"
            if len(runs) == 1
            else ", one line per run"
        )
        parts.append(_img(cdf, "latency CDFs", caption))
    parts.append("</section>")

    parts.append('<section id="timeseries"><h2>Over time</h2>')
    figs = timeseries_figures(runs)
    if not figs:
        parts.append('<p class="meta">No timeseries.parquet in these runs.</p>')
    else:
        parts.append('<div class="figs">')
        parts += [_img(b64, t, t) for t, b64 in figs]
        parts.append("</div>")
    parts.append("</section>")

    configs = [r for r in runs if r.config]
    if configs:
        parts.append('<section id="configs"><h2>Resolved configurations</h2>')
        for r in configs:
            parts.append(
                f"<details><summary>{_e(r.label)}</summary><pre>{_e(r.config)}</pre></details>"
            )
        parts.append("</section>")
    parts += ["</body>", "</html>", ""]
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
