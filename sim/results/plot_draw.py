"""A run's plots drawn from plain data: figures described as dicts of numpy arrays and strings
(:mod:`.plots` builds them from a result) rendered to PNG bytes with matplotlib's Agg backend.

Nothing here reads pandas or the result, so the plot worker (:mod:`.plot_worker`) can draw a
run's figures in a process that imported only numpy and matplotlib. A figure is::

    {"name": "latency_cdf.png", "title": ... or None, "top": 0.88, "panels": [panel, ...]}

and a panel ``{"lines": [(label, x, y), ...], "title", "xlabel", "ylabel", "vline": (x, label)
or None, "xlog": bool, "ysymlog": bool, "ylim": (lo, hi) or None}``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

DPI = 110
# zlib's fastest level: the PNGs come out ~10 % larger and encode in half the time
_PNG_OPTIONS = {"pil_kwargs": {"compress_level": 1}}
_SLO_COLOR = "#b3261e"


def _plain() -> FuncFormatter:
    """Tick labels as plain numbers (0.01, 1, 1e+03): no mathtext to parse and typeset."""
    return FuncFormatter(lambda x, _pos: f"{x:g}")


def _panel(ax: Any, panel: dict[str, Any]) -> None:
    for label, x, y in panel["lines"]:
        ax.plot(x, y, label=label)
    vline = panel.get("vline")
    if vline is not None:
        ax.axvline(vline[0], color=_SLO_COLOR, linestyle="--", linewidth=1.2, label=vline[1])
    if panel.get("xlog"):
        ax.set_xscale("log")
        # decades labelled as plain numbers (0.01, 1, 10), the minor ticks unlabelled (their
        # labels overlap on short ranges) and only at 2 and 5: each tick is a handful of artists,
        # and the eight of every decade were a third of the drawing
        ax.xaxis.set_major_formatter(_plain())
        ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if panel.get("ysymlog"):
        ax.set_yscale("symlog")
        ax.yaxis.set_major_formatter(_plain())
    if panel.get("ylim") is not None:
        ax.set_ylim(*panel["ylim"])
    if panel.get("title"):
        ax.set_title(panel["title"])
    ax.set_xlabel(panel["xlabel"])
    if panel.get("ylabel"):
        ax.set_ylabel(panel["ylabel"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def draw(figures: list[dict[str, Any]]) -> Iterator[tuple[str, Any]]:
    """``(file name, figure)`` for each described figure, a row of panels 13 × 3.6 in; the
    caller saves and closes each."""
    for spec in figures:
        panels = spec["panels"]
        fig, axes = plt.subplots(1, len(panels), figsize=(13, 3.6), squeeze=False)
        for ax, panel in zip(axes[0], panels, strict=True):
            _panel(ax, panel)
        if spec["title"]:
            fig.suptitle(spec["title"])
        # the margins tight_layout finds for these labels, without its text measuring (half a
        # 10-request run's wall time)
        fig.subplots_adjust(left=0.055, right=0.99, bottom=0.14, top=spec["top"], wspace=0.24)
        yield spec["name"], fig


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, dpi=DPI, format="png", **_PNG_OPTIONS)
    return buf.getvalue()


def warm_up() -> None:
    """Draw and encode one small figure with text, a legend and a log axis, so that the fonts,
    the text layout caches and the PNG encoder are loaded before the run's figures arrive (the
    plot worker calls it while the run simulates)."""
    fig, ax = plt.subplots(figsize=(2, 1))
    try:
        _panel(ax, {"lines": [("a", [1.0, 10.0], [0.0, 1.0])], "xlabel": "s", "xlog": True})
        png(fig)
    finally:
        plt.close(fig)


def render(figures: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """Each described figure as ``(file name, PNG bytes)``."""
    out = []
    for name, fig in draw(figures):
        try:
            out.append((name, png(fig)))
        finally:
            plt.close(fig)
    return out
