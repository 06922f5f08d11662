"""PNG plots of one run: latency CDFs (with the SLOs as dashed lines), throughput, queue depths
and busy fraction over time (downsampled, ``sim/results/downsample.py``). :func:`plot_data`
describes the figures as plain arrays, :mod:`.plot_draw` renders them — in the plot worker
(:mod:`.plot_worker`) when ``run`` started one, else here — and :func:`plots_output` writes each
PNG atomically, last of a run's files, or measures them when a full disk asks what they need."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import plot_worker
from .columns import Categorical
from .downsample import downsample
from .files import Output, write_bytes

if TYPE_CHECKING:
    from .result import Result


_CDF_POINTS = 4096
"""Points of a CDF line at most (evenly spaced ranks, the extremes included): a million
requests draw the same curve without a million-vertex path."""


def _cdf(values: Any, label: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if not v.size:
        return []
    rank = np.arange(1, v.size + 1)
    if v.size > _CDF_POINTS:
        rank = np.unique(np.linspace(1, v.size, _CDF_POINTS).astype(np.int64))
    return [(label, v[rank - 1], rank / v.size)]


def _line(ts: Any, col: str, label: str) -> tuple[str, np.ndarray, np.ndarray]:
    b = downsample(ts["t_s"], ts[col])
    return (label, np.asarray(b.t, dtype=float), np.asarray(b.mean, dtype=float))


def plot_data(result: Result) -> list[dict[str, Any]]:
    """The run's figures as :mod:`.plot_draw` describes them (plain arrays and strings), from
    the result's columns (no DataFrame: a run that plots need not import pandas)."""
    req, ts = result.request_table, result.timeseries_table
    classes = req.columns["traffic_class"]
    assert isinstance(classes, Categorical)
    slo = result.scenario.slo
    panels = []
    for col, title, limit in (
        ("ttft_s", "TTFT", slo.ttft_s),
        ("tpot_s", "TPOT", slo.tpot_s),
        ("e2e_s", "E2E latency", slo.e2e_s),
    ):
        lines = []
        values = req[col]
        for code, cls in enumerate(classes.categories):
            lines += _cdf(values[classes.codes == code], str(cls))
        lines += _cdf(values, "all")
        panels.append(
            {
                "lines": lines,
                "vline": None if limit is None else (limit, f"SLO {limit} s"),
                "xlog": True,
                "xlabel": f"{title} (s)",
                "ylabel": "fraction of requests",
            }
        )
    figures = [
        {
            "name": "latency_cdf.png",
            "title": f"{result.scenario.name}: latency CDFs",
            "top": 0.88,
            "panels": panels,
        }
    ]
    if not ts.empty:
        panels = [
            _series(ts, "throughput", THROUGHPUT, ysymlog=True),
            _series(ts, "requests by stage", STAGES),
            _series(ts, "busy fraction and KV occupancy", BUSY, ylim=(0, 1.05)),
        ]
        figures.append({"name": "timeseries.png", "title": None, "top": 0.91, "panels": panels})
    return figures


THROUGHPUT = (("output_tok_per_s", "output tok/s"), ("prefill_tok_per_s", "prefill tok/s"))
STAGES = (
    ("prefill_queue", "prefill queue"),
    ("transfers_in_flight", "transfers in flight"),
    ("decode_waiting", "decode waiting"),
    ("decode_running", "decode running"),
)
BUSY = (
    ("prefill_util", "prefill busy"),
    ("decode_util", "decode busy"),
    ("decode_kv_reserved_frac", "decode KV reserved"),
)


def _series(ts: Any, title: str, columns: tuple[tuple[str, str], ...], **more: Any) -> dict:
    """A time-series panel: each (column, label) of ``ts`` downsampled, over simulated time."""
    lines = [_line(ts, col, label) for col, label in columns]
    return {"lines": lines, "title": title, "xlabel": "simulated time (s)", **more}


def render_here(figures: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """The figures' PNG bytes, drawn in this process."""
    from .plot_draw import render

    return render(figures)


def write_pngs(folder: Path, pngs: list[tuple[str, bytes]]) -> list[Path]:
    """Each ``(name, PNG bytes)`` as ``folder/name``, atomically (an
    :class:`~.files.OutputError` when one cannot be written)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name, data in pngs:
        paths.append(write_bytes(folder / name, data))
    return paths


def plots_output(result: Result) -> Output:
    """The plots as a run's last output. A worker ``run`` started gets the figures now, so it
    draws while the other files are written; without one (or when it fails) they are drawn
    here when their turn comes."""
    figures = plot_data(result)
    worker = plot_worker.take()
    if worker is not None:
        worker.submit(figures)

    @functools.cache
    def rendered() -> list[tuple[str, bytes]]:
        done = worker.result() if worker is not None else None
        return done if done is not None else render_here(figures)

    return Output(
        "plots",
        lambda p: write_pngs(p, rendered()),
        lambda: sum(len(data) for _, data in rendered()),
    )
