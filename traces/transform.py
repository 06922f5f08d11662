"""Re-timing transforms on a :class:`RequestSource`.

Mooncake timestamps are quantized: requests arrive in batches about 3 s apart that share one
timestamp. Replayed literally, each batch hits the cluster as a single burst. ``spread_buckets``
spreads every batch over the bucket it stands for, ``[t, t + window_s)``:

- ``"uniform"``: i.i.d. uniform offsets drawn from the given generator (the natural model if
  the true arrival times were rounded down to the bucket start);
- ``"even"``: offsets ``j * window_s / k`` for the ``j``-th of ``k`` requests, in row (file)
  order, so the first stays at ``t``;
- ``"none"``: no change.

Only timestamps shared by two or more requests are spread; a lone request keeps its time, so a
trace with distinct timestamps (Azure) is left alone. The result is re-sorted stably by the new
times (a wide window can interleave neighbouring buckets) and the block lists move with their
requests.
"""

from __future__ import annotations

import math

import numpy as np

from deepinfer_sim.traces.source import RequestSource

__all__ = ["SPREAD_METHODS", "spread_buckets"]

SPREAD_METHODS = ("uniform", "even", "none")


def spread_buckets(
    source: RequestSource,
    window_s: float,
    method: str = "uniform",
    rng: np.random.Generator | int | None = None,
) -> RequestSource:
    """Spread requests that share a timestamp over ``[t, t + window_s)``.

    ``rng`` (a ``numpy.random.Generator`` or an int seed) is required for ``"uniform"``, so a
    run is always reproducible; the other methods ignore it.
    """
    if method not in SPREAD_METHODS:
        raise ValueError(f"spread_buckets: method must be one of {SPREAD_METHODS}, got {method!r}")
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"spread_buckets: window_s must be finite and > 0, got {window_s}")
    if method == "none" or len(source) == 0:
        return source
    if method == "uniform" and rng is None:
        raise ValueError("spread_buckets: method 'uniform' needs rng (a Generator or a seed)")

    t = source.arrival_s
    n = len(t)
    # Rows are sorted, so equal timestamps form contiguous runs ("buckets").
    starts = np.flatnonzero(np.concatenate([[True], t[1:] != t[:-1]]))
    sizes = np.diff(np.append(starts, n))
    size = np.repeat(sizes, sizes)
    rank = np.arange(n) - np.repeat(starts, sizes)

    if method == "uniform":
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        fraction = gen.random(n)  # drawn for every row, so the stream does not depend on sizes
    else:
        fraction = rank / size
    offset = np.where(size > 1, fraction * window_s, 0.0)
    # Keep t <= new < t + window_s despite rounding in the addition.
    upper = np.nextafter(t + window_s, -np.inf)
    new = np.maximum(np.minimum(t + offset, upper), t)
    return source.with_arrivals(new)
