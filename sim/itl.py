"""Inter-token latencies, rebuilt exactly after the run from per-step records.

A decode group steps all its sequences together, so every token a sequence emits after its first
decode step arrives exactly one step duration after the previous one; only the first decode token
has its own gap (from the first token, delivered with the KV hand-off, to the end of the
sequence's first step). From each group's step table and each request's first/last step we get
the ITL distribution (step durations weighted by the sequences that stepped, plus the first gaps)
and each request's largest ITL (a range-maximum query over the step durations).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .metrics import PERCENTILES

if TYPE_CHECKING:
    from .decode import DecodeGroup
    from .requests import RequestTable


def range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[i] : hi[i] + 1]) for each i (lo <= hi), via a sparse table."""
    if lo.size == 0:
        return np.zeros(0)
    levels = [values]
    width = 1
    while 2 * width <= values.size:
        prev = levels[-1]
        levels.append(np.maximum(prev[:-width], prev[width:]))
        width *= 2
    span = hi - lo + 1
    j = np.floor(np.log2(span)).astype(np.int64)
    out = np.empty(lo.size)
    for level in np.unique(j):
        sel = j == level
        table = levels[level]
        out[sel] = np.maximum(table[lo[sel]], table[hi[sel] - (1 << level) + 1])
    return out


def weighted_stats(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order].astype(float)
    cum = np.cumsum(w)
    total = cum[-1]
    out = {"mean": float((v * w).sum() / total)}
    for p in PERCENTILES:
        out[f"p{p}"] = float(v[min(np.searchsorted(cum, p / 100 * total), v.size - 1)])
    return out


def itl_summary(
    table: RequestTable, groups: Sequence[DecodeGroup]
) -> tuple[dict[str, float], np.ndarray]:
    """(ITL distribution stats, per-request largest ITL with NaN where there was none)."""
    max_itl = np.full(table.n, np.nan)
    values: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    for g in groups:
        end, dt, n, new = g.step_table()
        if dt.size == 0:
            continue
        values.append(dt)
        weights.append(n - new)
        rids = np.flatnonzero((table.decode_group == g.idx) & (table.decode_first_step >= 0))
        k0 = table.decode_first_step[rids]
        stepped = k0 < dt.size
        rids, k0 = rids[stepped], k0[stepped]
        first_gap = end[k0] - table.t_transfer_end[rids]
        values.append(first_gap)
        weights.append(np.ones(first_gap.size, dtype=np.int64))
        k1 = table.decode_last_step[rids]
        finished = k1 >= 0
        worst = first_gap.copy()
        later = finished & (k1 > k0)
        worst[later] = np.maximum(worst[later], range_max(dt, k0[later] + 1, k1[later]))
        max_itl[rids[finished]] = worst[finished]
    if not values:
        return weighted_stats(np.zeros(0), np.zeros(0)), max_itl
    return weighted_stats(np.concatenate(values), np.concatenate(weights)), max_itl
