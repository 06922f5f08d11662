"""Inter-token latencies, rebuilt exactly after the run from per-step records.

ITL here is measured **per decode step**, the way ``vllm bench serve`` measures it per streamed
chunk: a decode group steps all its sequences together, and everything a sequence emits in one
step (one token, or under speculative decoding every accepted draft plus the bonus token) arrives
at the step's end, one step duration after its previous step's tokens. Only a sequence's first
step has its own gap (from the first token, delivered with the KV hand-off, to the end of that
step), and so has a step after steps the sequence sat out (an aggregated rank that prefilled
instead, ``scheduler: prefill_first``): the step and the wait before it. From each group's step
table, its waits and each request's first/last step we get the per-step ITL distribution
(step durations weighted by the sequences that stepped, plus the first gaps and the waited
steps) and each request's largest ITL (a range-maximum query over the step durations, and its
waited steps). Percentiles of these
weighted samples are the weighted inverse CDF (the smallest value whose cumulative weight
reaches p %), not numpy's interpolation.

The per-token ITL (``itl_per_token_s``) divides each gap by the tokens a sequence emitted in
that step and counts it once per token. A group records the tokens all its sequences emitted in
a step, not each sequence's share, so a step's gap is divided by the step's mean tokens per
sequence: the mean per-token ITL is exact, its spread under speculative decoding is narrowed to
the steps' means. Without speculative decoding both distributions are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .metrics import REQUIRED_PERCENTILES, latency_percentiles, pct_key

if TYPE_CHECKING:
    from ..core.requests import RequestTable
    from ..stages.decode import DecodeGroup


def range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[i] : hi[i] + 1]) for each i (lo <= hi), via a sparse table built one level
    at a time (level L holds the maxima of windows of 2**L; each query reads the one level
    its span needs, so only the current level is kept)."""
    if lo.size == 0:
        return np.zeros(0)
    span = hi - lo + 1
    j = np.frexp(span.astype(np.float64))[1].astype(np.int64) - 1  # floor(log2), exactly
    out = np.empty(lo.size)
    level = values
    for depth in range(int(j.max()) + 1):
        if depth:
            width = 1 << (depth - 1)
            level = np.maximum(level[:-width], level[width:])
        sel = j == depth
        if sel.any():
            out[sel] = np.maximum(level[lo[sel]], level[hi[sel] - (1 << depth) + 1])
    return out


def weighted_stats(
    values: np.ndarray, weights: np.ndarray, percentiles: Sequence[float] = REQUIRED_PERCENTILES
) -> dict[str, float]:
    """mean, std, min, max and percentiles of ``values`` each counted ``weights`` times (the
    keys of :func:`~deepinfer_sim.sim.results.metrics.bench_stats`; NaN when no weight is
    positive)."""
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    keys = [pct_key(p) for p in percentiles]
    if values.size == 0:
        return dict.fromkeys(["mean", "std", "min", "max", *keys], float("nan"))
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order].astype(float)
    cum = np.cumsum(w)
    total = cum[-1]
    mean = float((v * w).sum() / total)
    out = {"mean": mean, "std": float(np.sqrt((w * (v - mean) ** 2).sum() / total))}
    out["min"], out["max"] = float(v[0]), float(v[-1])
    for p, key in zip(percentiles, keys, strict=True):
        out[key] = float(v[min(np.searchsorted(cum, p / 100 * total), v.size - 1)])
    return out


def itl_summary(
    table: RequestTable,
    groups: Sequence[DecodeGroup],
    percentiles: Sequence[float] = REQUIRED_PERCENTILES,
) -> tuple[dict[str, dict[str, float]], np.ndarray]:
    """({"itl_s": per-step ITL stats, "itl_per_token_s": per-token ITL stats}, per-request
    largest per-step ITL with NaN where there was none). p50, p90 and p99 are always added to
    ``percentiles``."""
    percentiles = latency_percentiles(percentiles)
    max_itl = np.full(table.n, np.nan)
    values: list[np.ndarray] = []
    weights: list[np.ndarray] = []
    tok_values: list[np.ndarray] = []
    tok_weights: list[np.ndarray] = []
    for g in groups:
        end, dt, n, new = g.step_table()
        if dt.size == 0:
            continue
        # tokens a sequence emitted in each step, on average over the step's sequences
        per_seq = np.asarray(g.step_tokens, dtype=float) / np.maximum(n, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            tok_dt = dt / per_seq
        step_w = n - new
        # a sequence that sat steps out (an aggregated rank prefilling) waited before its step:
        # that step's sample for it is the step and the wait
        w_row = np.asarray(g.wait_row, dtype=np.int64)
        w_gap = dt[w_row] + np.asarray(g.wait_s_before)
        if w_row.size:
            step_w = step_w - np.bincount(w_row, minlength=dt.size)
            values.append(w_gap)
            weights.append(np.ones(w_gap.size, dtype=np.int64))
            with np.errstate(divide="ignore", invalid="ignore"):
                tok_values.append(w_gap / per_seq[w_row])
            tok_weights.append(per_seq[w_row])
        values.append(dt)
        weights.append(step_w)
        tok_values.append(tok_dt)
        tok_weights.append(step_w * per_seq)
        rids = np.flatnonzero((table.decode_group == g.idx) & (table.decode_first_step >= 0))
        k0 = table.decode_first_step[rids]
        stepped = k0 < dt.size
        rids, k0 = rids[stepped], k0[stepped]
        first_gap = end[k0] - table.t_transfer_end[rids]
        values.append(first_gap)
        weights.append(np.ones(first_gap.size, dtype=np.int64))
        with np.errstate(divide="ignore", invalid="ignore"):
            tok_values.append(first_gap / per_seq[k0])
        tok_weights.append(per_seq[k0])
        k1 = table.decode_last_step[rids]
        finished = k1 >= 0
        worst = first_gap.copy()
        later = finished & (k1 > k0)
        worst[later] = np.maximum(worst[later], range_max(dt, k0[later] + 1, k1[later]))
        max_itl[rids[finished]] = worst[finished]
        if w_row.size:  # the waits: a gap longer than any one step
            w_rid = np.asarray(g.wait_rid, dtype=np.int64)
            done = table.decode_last_step[w_rid] >= 0
            np.fmax.at(max_itl, w_rid[done], w_gap[done])
    if not values:
        empty = weighted_stats(np.zeros(0), np.zeros(0), percentiles)
        return {"itl_s": empty, "itl_per_token_s": dict(empty)}, max_itl
    stats = {
        "itl_s": weighted_stats(np.concatenate(values), np.concatenate(weights), percentiles),
        "itl_per_token_s": weighted_stats(
            np.concatenate(tok_values), np.concatenate(tok_weights), percentiles
        ),
    }
    return stats, max_itl
