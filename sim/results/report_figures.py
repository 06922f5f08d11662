"""The figures of a what-if report, as base64 PNGs (matplotlib, Agg backend).

Latency CDFs put each run's SLO on the axis as a dashed line and the p99 level as a dotted one,
so a reader sees at once whether the p99 falls left of the limit; the x axis is log-scaled with
1-2-5 ticks labelled in ms or s when the values span a decade or more, linear otherwise.

Time series are downsampled before they are drawn (``sim/results/downsample.py``): a long run
has tens of thousands of rows, which a 450-pixel panel can only show as a band of noise. Each
panel draws the mean of each bin (line) and its min-max range (band); a bin with no finite
sample (the prefix hit rate while nothing was looked up) stays NaN, so the line has a gap there,
not a fake zero. Legends name at most the runs and the panel's columns.

Axis numbers are plain below a thousand and take k / M / G above (:func:`axis_number`), never
an SI prefix below one: matplotlib's engineering formatter labels 0.5 as ``500m``, which on a
count of waiting requests reads as milli-requests, and on GB/s as thousandths of one. A count panel
(requests) ticks whole numbers only, and reaches at least 1 so that an empty queue is a line at
0 with the ticks 0 and 1, not 0 to 0.05."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from .downsample import MAX_POINTS, downsample
from .report_numbers import seconds

if TYPE_CHECKING:
    from .report import RunData

FULL_SCALE_FROM = 0.2  # a fraction panel whose values reach this is drawn from 0 to 100 %
MAX_CLASSES = 4  # traffic classes drawn apart in a one-run CDF; more: only "all"


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    columns: tuple[tuple[str, str], ...]  # (time-series column, legend label)
    fraction: bool = False  # a 0..1 quantity: percent axis from 0 to 100 %
    note: str = ""
    count: bool = False  # a number of requests: whole-number ticks


PANELS: list[Panel] = [
    Panel("Output tokens / s", "tokens / s", (("output_tok_per_s", "output"),)),
    Panel("Prefill tokens / s", "tokens / s", (("prefill_tok_per_s", "computed"),)),
    Panel(
        "Waiting requests",
        "requests",
        (
            ("vision_queue", "vision queue"),
            ("prefill_queue", "prefill queue"),
            ("decode_waiting", "decode waiting"),
        ),
        count=True,
    ),
    Panel(
        "Requests in decode",
        "requests",
        (("decode_running", "decoding"), ("transfers_in_flight", "P→D transfers")),
        count=True,
    ),
    Panel(
        "Busy fraction",
        "time stepping",
        (("vision_util", "vision"), ("prefill_util", "prefill"), ("decode_util", "decode")),
        fraction=True,
        note="Decode steps whenever it holds a sequence: its occupancy shows how full it is.",
    ),
    Panel(
        "Decode occupancy",
        "of capacity",
        (("decode_batch_fill", "batch slots"), ("decode_kv_reserved_frac", "KV reserved")),
        fraction=True,
    ),
    Panel(
        "Prefix hit rate",
        "of prompt tokens",
        (("prefix_hit_rate", "hit rate"),),
        fraction=True,
        note="Gaps: no prompt was looked up.",
    ),
    Panel(
        "Expert imbalance",
        "max / mean load",
        (("prefill_imbalance", "prefill"), ("decode_imbalance", "decode")),
    ),
    Panel("KV storage used", "of capacity", (("storage_used_frac", "used"),), fraction=True),
    Panel("KV storage reads", "GB / s", (("storage_read_gbps", "read"),)),
]

CDFS = (("ttft_s", "TTFT", "ttft_s"), ("tpot_s", "TPOT", "tpot_s"), ("e2e_s", "E2E", "e2e_s"))


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig: Any) -> str:
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


# ---- time series --------------------------------------------------------------------------------


def axis_number(x: float, _pos: Any = None) -> str:
    """A tick label: 1,200 as 1.2k, 3e6 as 3M, 0.5 as 0.5 (never 500m), 0 as 0."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.4g}{prefix}"
    text = f"{x:.4g}"
    if "e" in text:  # 1e-05: positional, as the other labels are
        text = np.format_float_positional(float(text), trim="-")
    return "0" if text == "-0" else text


def with_derived_columns(ts: pd.DataFrame, summary: dict[str, Any]) -> pd.DataFrame:
    """Add ``decode_batch_fill`` (mean sequences per rank over the per-rank limit)."""
    limit = (summary.get("load") or {}).get("decode", {}).get("max_seqs_per_rank")
    if "decode_batch_mean" in ts.columns and isinstance(limit, int | float) and limit > 0:
        ts = ts.assign(decode_batch_fill=ts["decode_batch_mean"] / limit)
    return ts


def _series(r: RunData, col: str) -> pd.Series | None:
    ts = r.timeseries
    if ts is None or "t_s" not in ts.columns or col not in ts.columns:
        return None
    y = pd.to_numeric(ts[col], errors="coerce")
    if y.isna().all() or (col.startswith("vision_") and not y.fillna(0).any()):
        return None  # missing, or a vision column of a run without a vision pool
    return y


def timeseries_figures(runs: list[RunData]) -> list[tuple[Panel, str]]:
    """(panel, base64 PNG) for each panel at least one run has data for."""
    plt = _plt()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles: tuple[Literal["-", "--", ":", "-."], ...] = ("-", "--", ":", "-.")
    out = []
    for panel in PANELS:
        drawn: list[tuple[int, int, str]] = []  # (run index, column index, label)
        ymax = 0.0
        fig, ax = plt.subplots(figsize=(4.6, 2.9))
        for i, r in enumerate(runs):
            for j, (col, label) in enumerate(panel.columns):
                y = _series(r, col)
                if y is None:
                    continue
                assert r.timeseries is not None
                b = downsample(r.timeseries["t_s"], y)
                color = colors[(i if len(runs) > 1 else j) % len(colors)]
                style = styles[j % len(styles)] if len(runs) > 1 else "-"
                ax.plot(b.t, b.mean, color=color, linestyle=style, linewidth=1.2)
                if b.per_bin > 1:
                    ax.fill_between(b.t, b.lo, b.hi, color=color, alpha=0.18, linewidth=0)
                drawn.append((i, j, label))
                ymax = max(ymax, float(np.nanmax(b.hi)))
        if not drawn:
            plt.close(fig)
            continue
        run_ids = sorted({i for i, _, _ in drawn})
        col_ids = sorted({j for _, j, _ in drawn})
        handles = []
        if len(runs) == 1:
            if len(col_ids) > 1:
                handles = [
                    Line2D([], [], color=colors[j % len(colors)], label=panel.columns[j][1])
                    for j in col_ids
                ]
        else:
            handles = [
                Line2D([], [], color=colors[i % len(colors)], label=runs[i].label) for i in run_ids
            ]
            if len(col_ids) > 1:
                handles += [
                    Line2D(
                        [],
                        [],
                        color="0.4",
                        linestyle=styles[j % len(styles)],
                        label=panel.columns[j][1],
                    )
                    for j in col_ids
                ]
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.8)
        if panel.fraction:
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))
            # 0..100 % unless everything stays far below: then its own scale, or it is a flat line
            top = max(1.0, ymax) if ymax >= FULL_SCALE_FROM else max(ymax, 1e-9) * 1.25
            ax.set_ylim(0, top * 1.05)
        else:
            ax.yaxis.set_major_formatter(FuncFormatter(axis_number))
            if panel.count:
                ax.yaxis.set_major_locator(MaxNLocator(integer=True))
                ax.set_ylim(0, max(1.0, ymax) * 1.05)
            elif panel.title != "Expert imbalance":  # a factor from 1 up: 0 would flatten it
                ax.set_ylim(bottom=0)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("simulated time (s)", fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        out.append((panel, png(fig)))
    return out


def bin_note(runs: list[RunData]) -> str:
    """What a line and a band are, from the runs' sampling (one sentence)."""
    widths = []
    for r in runs:
        ts = r.timeseries
        if ts is None or "t_s" not in ts.columns or len(ts) < 2:
            continue
        per_bin = max(1, -(-len(ts) // MAX_POINTS))
        step = float(np.median(np.diff(ts["t_s"].to_numpy(dtype=float))))
        widths.append((per_bin, step))
    if not widths or all(k == 1 for k, _ in widths):
        return "One point per time-series sample."
    k, step = max(widths)
    return (
        f"Downsampled to at most {MAX_POINTS} points: the line is the mean over "
        f"{k} samples ({k * step:g} s of simulated time), the band their min–max."
    )


# ---- latency CDFs -------------------------------------------------------------------------------


def _finite_positive(values: Any) -> np.ndarray:
    v = np.sort(np.asarray(values, dtype=float))
    return v[np.isfinite(v) & (v > 0)]


def _time_axis(ax: Any, lo: float, hi: float) -> None:
    """Readable x axis from ``lo`` to ``hi`` seconds: log with 1-2-5 ticks over a decade or
    more, linear below; tick labels in µs / ms / s."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

    label = FuncFormatter(lambda x, _pos: seconds(x) if x > 0 else "0")
    decades = np.log10(hi / lo)
    if decades >= 1:
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.15, hi * 1.15)
        subs = (1.0, 2.0, 5.0) if decades < 2.5 else (1.0, 3.0) if decades < 4 else (1.0,)
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        pad = (hi - lo) * 0.05
        ax.set_xlim(max(0.0, lo - pad), hi + pad)
        ax.xaxis.set_major_locator(MaxNLocator(6))
    ax.xaxis.set_major_formatter(label)


def latency_figure(runs: list[RunData]) -> str | None:
    """CDFs of TTFT, TPOT and E2E: per traffic class for one run (up to ``MAX_CLASSES``), one
    line per run else; the SLOs as dashed vertical lines, the p99 level dotted."""
    plt = _plt()
    have = [r for r in runs if r.requests is not None and not r.requests.empty]
    if not have:
        return None
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for ax, (col, title, slo_key) in zip(axes, CDFS, strict=True):
        lo, hi = np.inf, 0.0
        n_lines = 0
        for i, r in enumerate(have):
            req = r.requests
            assert req is not None
            if col not in req.columns:
                continue
            series: list[tuple[str, Any]] = [(r.label if len(have) > 1 else "all", req[col])]
            if len(have) == 1 and "traffic_class" in req.columns:
                classes = pd.unique(req["traffic_class"].dropna())
                if 1 < len(classes) <= MAX_CLASSES:
                    series += [(str(c), req.loc[req["traffic_class"] == c, col]) for c in classes]
            for k, (label, values) in enumerate(series):
                v = _finite_positive(values)
                if not v.size:
                    continue
                color = colors[(i if len(have) > 1 else k) % len(colors)]
                ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label, color=color)
                lo, hi = min(lo, float(v[0])), max(hi, float(v[-1]))
                n_lines += 1
        limits = sorted({float(r.slo[slo_key]) for r in have if _num(r.slo.get(slo_key))})
        for limit in limits:
            ax.axvline(limit, color="#b3261e", linestyle="--", linewidth=1.2)
            ax.annotate(
                f"SLO {seconds(limit)}",
                (limit, 0.5),
                xytext=(-4, 0),
                textcoords="offset points",
                ha="right",
                va="center",
                fontsize=8,
                color="#b3261e",
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
            )
            lo, hi = min(lo, limit), max(hi, limit)
        ax.set_title(title, fontsize=10)
        if hi > 0 and np.isfinite(lo):
            _time_axis(ax, lo, hi)
            ax.axhline(0.99, color="0.4", linestyle=":", linewidth=1)
            ax.annotate(
                "p99",
                (0.01, 0.985),
                xycoords=("axes fraction", "data"),
                fontsize=7,
                ha="left",
                va="top",
                color="0.3",
            )
        ax.set_xlabel(f"{title} (log scale)" if ax.get_xscale() == "log" else title, fontsize=8)
        ax.set_ylabel("fraction of requests", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if n_lines > 1:
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return png(fig)


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)
