"""PNG plots of one run: latency CDFs, throughput over time, queue depths over time."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

if TYPE_CHECKING:
    from .result import Result


def _cdf(ax, values, label: str) -> None:
    v = np.sort(np.asarray(values, dtype=float))
    v = v[np.isfinite(v)]
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)


def write_plots(result: Result, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    req, ts = result.requests, result.timeseries
    paths: list[Path] = []

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, col, title in zip(
        axes, ("ttft_s", "tpot_s", "e2e_s"), ("TTFT", "TPOT", "E2E latency"), strict=True
    ):
        for cls in req["traffic_class"].cat.categories:
            sel = req.loc[req["traffic_class"] == cls, col]
            _cdf(ax, sel, str(cls))
        _cdf(ax, req[col], "all")
        ax.set_xscale("log")
        ax.set_xlabel(f"{title} (s)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result.scenario.name}: latency CDFs")
    fig.tight_layout()
    paths.append(folder / "latency_cdf.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    if not ts.empty:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        axes[0].plot(ts["t_s"], ts["output_tok_per_s"], label="output tok/s")
        axes[0].plot(ts["t_s"], ts["prefill_tok_per_s"], label="prefill tok/s")
        axes[0].set_yscale("symlog")
        axes[0].set_title("throughput")
        axes[1].plot(ts["t_s"], ts["prefill_queue"], label="prefill queue")
        axes[1].plot(ts["t_s"], ts["transfers_in_flight"], label="transfers in flight")
        axes[1].plot(ts["t_s"], ts["decode_waiting"], label="decode waiting")
        axes[1].plot(ts["t_s"], ts["decode_running"], label="decode running")
        axes[1].set_title("requests by stage")
        axes[2].plot(ts["t_s"], ts["prefill_util"], label="prefill")
        axes[2].plot(ts["t_s"], ts["decode_util"], label="decode")
        axes[2].plot(ts["t_s"], ts["decode_kv_reserved_frac"], label="decode KV reserved")
        axes[2].set_title("utilization")
        for ax in axes:
            ax.set_xlabel("simulated time (s)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(folder / "timeseries.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths
