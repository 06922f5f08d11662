"""Trace statistics: lengths, arrival rate and burstiness, prefix reuse, classes.

Design notes
------------
:func:`trace_stats` summarises a :class:`RequestSource` as a plain, JSON-ready dict (undefined
numbers, such as the rate of a one-request trace, are ``None`` rather than NaN), for the
``trace stats`` command and for notebooks. Everything is vectorized except the LRU replay,
which is inherently sequential: :func:`lru_prefix_hit_tokens` walks the block references once
with an ``OrderedDict`` (about a million references per second).

Prefix reuse follows :meth:`RequestSource.prefix_hit_tokens`: requests are replayed in arrival
order, a block hits only while every block before it in the same request hit, and a partial
last block counts its actual tokens. The hit fraction is token-weighted: served prompt tokens
over all prompt tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import numpy.typing as npt

from deepinfer_sim.traces.source import RequestSource

__all__ = ["lru_prefix_hit_tokens", "trace_stats"]


def _block_token_counts(source: RequestSource) -> npt.NDArray[np.int64]:
    """Tokens in each block reference: ``block_tokens``, except a partial last block."""
    tokens = np.full(len(source.block_hashes), source.block_tokens, dtype=np.int64)
    counts = source.n_blocks
    last = source.block_offsets[1:][counts > 0] - 1
    tokens[last] = (source.input_len - source.block_tokens * (counts - 1))[counts > 0]
    return tokens


def lru_prefix_hit_tokens(source: RequestSource, capacity_blocks: int) -> npt.NDArray[np.int64]:
    """Per request, the prompt tokens an LRU prefix cache of ``capacity_blocks`` blocks serves.

    Requests are replayed in arrival order. Each looks up its blocks in order: a block that
    is cached is a hit while no earlier block of the request missed, and is touched (made most
    recently used) either way; a missing block is inserted, evicting the least recently used
    block when the cache is full. With a capacity of at least the number of distinct blocks
    this equals :meth:`RequestSource.prefix_hit_tokens`.
    """
    if capacity_blocks < 0:
        raise ValueError(f"capacity_blocks: expected >= 0, got {capacity_blocks}")
    n = len(source)
    hits = np.zeros(n, dtype=np.int64)
    if n == 0:
        return hits
    hashes = source.block_hashes.tolist()
    offsets = source.block_offsets.tolist()
    tokens = _block_token_counts(source).tolist()
    cache: OrderedDict[int, None] = OrderedDict()
    # Hot loop: plain lists and local names, one dict operation per block reference.
    touch = cache.move_to_end
    evict = cache.popitem
    for i in range(n):
        served = 0
        prefix = True
        for k in range(offsets[i], offsets[i + 1]):
            h = hashes[k]
            if h in cache:
                touch(h)
                if prefix:
                    served += tokens[k]
            else:
                prefix = False
                cache[h] = None
                if len(cache) > capacity_blocks:
                    evict(last=False)
        hits[i] = served
    return hits


def _distribution(values: np.ndarray) -> dict[str, float | None]:
    if len(values) == 0:
        return dict.fromkeys(("mean", "p50", "p90", "p99", "max"))
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(values.max()),
    }


def _rate(arrival: np.ndarray) -> dict[str, float | None]:
    """Mean rate, inter-arrival CV and per-minute peak over mean."""
    n = len(arrival)
    span = float(arrival[-1] - arrival[0]) if n else 0.0
    out: dict[str, float | None] = {
        "span_s": span,
        "mean_per_s": n / span if span > 0 else None,
        "interarrival_cv": None,
        "per_minute_mean": None,
        "per_minute_peak": None,
        "peak_to_mean_per_minute": None,
    }
    if n >= 2:
        gaps = np.diff(arrival)
        mean_gap = float(gaps.mean())
        out["interarrival_cv"] = float(gaps.std()) / mean_gap if mean_gap > 0 else None
    if n:
        # Minutes counted from the first arrival; empty minutes in between count as zero.
        minute = ((arrival - arrival[0]) // 60.0).astype(np.int64)
        per_minute = np.bincount(minute)
        mean = n / len(per_minute)
        out["per_minute_mean"] = mean
        out["per_minute_peak"] = float(per_minute.max())
        out["peak_to_mean_per_minute"] = float(per_minute.max()) / mean
    return out


def trace_stats(source: RequestSource, lru_blocks: int | None = None) -> dict[str, Any]:
    """Summarise a workload: sizes, lengths, rate and burstiness, prefix reuse, classes.

    Returns a JSON-ready dict:

    - ``name``, ``requests``, ``block_tokens``, ``sessions`` (distinct known session ids),
      ``image_requests`` (requests with at least one image);
    - ``input_tokens``/``output_tokens``: ``mean``, ``p50``, ``p90``, ``p99``, ``max``;
    - ``rate``: ``span_s``, ``mean_per_s``, ``interarrival_cv`` (standard deviation over
      mean of the gaps between consecutive arrivals: 1 for Poisson arrivals, larger when
      bursty), ``per_minute_mean``, ``per_minute_peak`` and ``peak_to_mean_per_minute`` of the
      request counts in the minutes from the first arrival (the last may be partial);
    - ``prefix``: ``block_refs``, ``unique_blocks``, ``infinite_hit_fraction`` (token-weighted
      share of prompt tokens an infinite prefix cache serves), and, when ``lru_blocks`` is
      given, ``lru_blocks`` and ``lru_hit_fraction`` for an LRU cache of that many blocks
      (:func:`lru_prefix_hit_tokens`), else ``None`` for both;
    - ``classes``: per traffic class, ``requests``, ``share``, ``input_mean``, ``output_mean``
      and ``infinite_hit_fraction``.

    Numbers that are undefined for this trace (e.g. a rate over a zero span) are ``None``.
    """
    n = len(source)
    total_input = int(source.input_len.sum())
    hits = source.prefix_hit_tokens() if n else np.zeros(0, dtype=np.int64)

    def fraction(served: int, total: int) -> float | None:
        return served / total if total else None

    prefix: dict[str, Any] = {
        "block_refs": len(source.block_hashes),
        "unique_blocks": len(np.unique(source.block_hashes)),
        "infinite_hit_fraction": fraction(int(hits.sum()), total_input),
        "lru_blocks": lru_blocks,
        "lru_hit_fraction": None,
    }
    if lru_blocks is not None:
        lru = lru_prefix_hit_tokens(source, lru_blocks)
        prefix["lru_hit_fraction"] = fraction(int(lru.sum()), total_input)

    classes: dict[str, dict[str, Any]] = {}
    for code, name in enumerate(source.class_names):
        mine = source.traffic_class == code
        count = int(mine.sum())
        inputs = source.input_len[mine]
        classes[name] = {
            "requests": count,
            "share": count / n if n else None,
            "input_mean": float(inputs.mean()) if count else None,
            "output_mean": float(source.output_len[mine].mean()) if count else None,
            "infinite_hit_fraction": fraction(int(hits[mine].sum()), int(inputs.sum())),
        }
    known = source.session_id[source.session_id >= 0]
    return {
        "name": source.name,
        "requests": n,
        "block_tokens": source.block_tokens,
        "sessions": len(np.unique(known)),
        "image_requests": int(np.count_nonzero(source.image_count)),
        "input_tokens": _distribution(source.input_len),
        "output_tokens": _distribution(source.output_len),
        "rate": _rate(source.arrival_s),
        "prefix": prefix,
        "classes": classes,
    }
