"""Downsampling of a time series for drawing: a panel a few hundred pixels wide cannot show tens
of thousands of samples as anything but a band of noise.

Consecutive samples (a run samples at a fixed interval) are grouped into at most ``MAX_POINTS``
bins; each bin keeps its mean time and the mean, min and max of the value over its finite
samples. A bin with none stays NaN, so a line drawn through the means has a gap there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_POINTS = 200


@dataclass(frozen=True)
class Binned:
    t: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    per_bin: int  # samples per bin (1: not downsampled)


def downsample(t: Any, y: Any, max_points: int = MAX_POINTS) -> Binned:
    """At most ``max_points`` bins of consecutive samples: the mean time, and the mean, min and
    max of ``y`` over the finite samples of each bin (NaN where a bin has none)."""
    tt = np.asarray(t, dtype=float)
    yy = np.asarray(y, dtype=float)
    per_bin = max(1, -(-tt.size // max_points))
    if per_bin == 1:
        return Binned(tt, yy, yy, yy, 1)
    starts = np.arange(0, tt.size, per_bin)
    sizes = np.diff(np.append(starts, tt.size))
    finite = np.isfinite(yy)
    counts = np.add.reduceat(finite.astype(np.int64), starts)
    sums = np.add.reduceat(np.where(finite, yy, 0.0), starts)
    lo = np.minimum.reduceat(np.where(finite, yy, np.inf), starts)
    hi = np.maximum.reduceat(np.where(finite, yy, -np.inf), starts)
    none = counts == 0  # a bin without a finite sample stays a gap
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums / counts
    mean[none] = lo[none] = hi[none] = np.nan
    return Binned(np.add.reduceat(tt, starts) / sizes, mean, lo, hi, per_bin)
