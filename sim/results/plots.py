"""PNG plots of one run: latency CDFs (with the SLOs as dashed lines), throughput, queue depths
and busy fraction over time (downsampled, ``sim/results/downsample.py``). Drawing is apart from
saving: :func:`figures` draws, :func:`write_plots` saves each PNG atomically, and
:func:`plots_output` measures them in memory when a full disk asks what they need."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

from .downsample import downsample
from .files import Output, atomic_write

if TYPE_CHECKING:
    from .result import Result

_DPI = 110


_CDF_POINTS = 4096
"""Points of a CDF line at most (evenly spaced ranks, the extremes included): a million
requests draw the same curve without a million-vertex path."""


def _cdf(ax, values, label: str) -> None:
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if v.size:
        rank = np.arange(1, v.size + 1)
        if v.size > _CDF_POINTS:
            rank = np.unique(np.linspace(1, v.size, _CDF_POINTS).astype(np.int64))
        ax.plot(v[rank - 1], rank / v.size, label=label)


def _line(ax, ts, col: str, label: str) -> None:
    b = downsample(ts["t_s"], ts[col])
    ax.plot(b.t, b.mean, label=label)


def _fixed_margins(fig: Any, top: float) -> None:
    """Margins for a 13 × 3.6 in row of three panels: what tight_layout finds for these
    labels, without its text measuring (half a 10-request run's wall time)."""
    fig.subplots_adjust(left=0.055, right=0.99, bottom=0.14, top=top, wspace=0.24)


def write_plots(result: Result, folder: Path) -> list[Path]:
    """Each figure as ``folder/<name>.png``, atomically (an :class:`~.files.OutputError` when
    one cannot be written)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for name, fig in figures(result):
        try:
            path = folder / name
            save = lambda tmp, fig=fig: fig.savefig(tmp, dpi=_DPI, format="png")  # noqa: E731
            atomic_write(path, save, _png(fig))
            paths.append(path)
        finally:
            plt.close(fig)
    return paths


def _png(fig: Any) -> Any:
    def size() -> int:
        buf = io.BytesIO()
        fig.savefig(buf, dpi=_DPI, format="png")
        return buf.tell()

    return size


def plots_bytes(result: Result) -> int:
    """The PNGs' bytes, drawn and saved in memory."""
    total = 0
    for _, fig in figures(result):
        total += _png(fig)()
        plt.close(fig)
    return total


def plots_output(result: Result) -> Output:
    return Output("plots", lambda p: write_plots(result, p), lambda: plots_bytes(result))


def figures(result: Result) -> Iterator[tuple[str, Any]]:
    """``(file name, figure)`` for each plot; the caller saves and closes each figure."""
    req, ts = result.requests, result.timeseries
    slo = result.scenario.slo

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, col, title, limit in zip(
        axes,
        ("ttft_s", "tpot_s", "e2e_s"),
        ("TTFT", "TPOT", "E2E latency"),
        (slo.ttft_s, slo.tpot_s, slo.e2e_s),
        strict=True,
    ):
        for cls in req["traffic_class"].cat.categories:
            sel = req.loc[req["traffic_class"] == cls, col]
            _cdf(ax, sel, str(cls))
        _cdf(ax, req[col], "all")
        if limit is not None:
            ax.axvline(
                limit, color="#b3261e", linestyle="--", linewidth=1.2, label=f"SLO {limit} s"
            )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on short ranges
        ax.set_xlabel(f"{title} (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result.scenario.name}: latency CDFs")
    _fixed_margins(fig, top=0.88)
    yield "latency_cdf.png", fig

    if not ts.empty:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        _line(axes[0], ts, "output_tok_per_s", "output tok/s")
        _line(axes[0], ts, "prefill_tok_per_s", "prefill tok/s")
        axes[0].set_yscale("symlog")
        axes[0].set_title("throughput")
        _line(axes[1], ts, "prefill_queue", "prefill queue")
        _line(axes[1], ts, "transfers_in_flight", "transfers in flight")
        _line(axes[1], ts, "decode_waiting", "decode waiting")
        _line(axes[1], ts, "decode_running", "decode running")
        axes[1].set_title("requests by stage")
        _line(axes[2], ts, "prefill_util", "prefill busy")
        _line(axes[2], ts, "decode_util", "decode busy")
        _line(axes[2], ts, "decode_kv_reserved_frac", "decode KV reserved")
        axes[2].set_ylim(0, 1.05)
        axes[2].set_title("busy fraction and KV occupancy")
        for ax in axes:
            ax.set_xlabel("simulated time (s)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        _fixed_margins(fig, top=0.91)
        yield "timeseries.png", fig
