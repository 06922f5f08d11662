"""Run metrics: latency distributions, throughput, goodput and cost, in vLLM-bench vocabulary.

Small helpers shared by the summary, the ITL reconstruction and the result writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

PERCENTILES = (50, 90, 99)


def _nan_stats() -> dict[str, float]:
    return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES}}


def dist_stats(values: np.ndarray | pd.Series) -> dict[str, float]:
    """mean, p50, p90, p99 of the finite values (NaN when there are none)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return _nan_stats()
    out = {"mean": float(v.mean())}
    pct = np.percentile(v, PERCENTILES)
    out.update({f"p{p}": float(x) for p, x in zip(PERCENTILES, pct, strict=True)})
    return out


# Always reported, whatever ``sim.percentiles`` asks for: the CLI table, the planner and the
# HTML report read them.
REQUIRED_PERCENTILES = (50.0, 90.0, 99.0)


def pct_key(p: float) -> str:
    """The key of a percentile, vLLM's style: 50 -> ``p50``, 99.9 -> ``p99.9``."""
    return f"p{p:g}"


def latency_percentiles(configured: Sequence[float]) -> tuple[float, ...]:
    """The configured percentiles plus the required ones, sorted, without duplicates."""
    return tuple(sorted({float(p) for p in (*configured, *REQUIRED_PERCENTILES)}))


def bench_stats(
    values: np.ndarray | pd.Series, percentiles: Sequence[float] = REQUIRED_PERCENTILES
) -> dict[str, float]:
    """``vllm bench serve``'s statistics of the finite values: mean, std (population), min,
    max and each percentile (linear interpolation, as numpy's and vLLM's); NaN when none."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    keys = [pct_key(p) for p in percentiles]
    if v.size == 0:
        return dict.fromkeys(["mean", "std", "min", "max", *keys], float("nan"))
    out = {"mean": float(v.mean()), "std": float(v.std()), "min": float(v.min())}
    out["max"] = float(v.max())
    pct = np.percentile(v, list(percentiles))
    out.update({k: float(x) for k, x in zip(keys, pct, strict=True)})
    return out


def round_floats(obj: Any, digits: int = 6) -> Any:
    """Round floats to significant digits so summary.json is stable and readable."""
    if isinstance(obj, float):
        if not np.isfinite(obj):
            return None
        return float(f"{obj:.{digits}g}")
    if isinstance(obj, dict):
        return {k: round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [round_floats(v, digits) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return round_floats(float(obj), digits)
    return obj
