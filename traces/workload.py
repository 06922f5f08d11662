"""Build the RequestSource a scenario's ``workload`` section describes.

Order of operations: read the trace (or generate multi-day sessions) -> spread bucketed
timestamps -> cut the time window (on the trace's own clock) -> keep the first ``max_requests``
-> tile ``repeat`` copies end to end (each copy's block ids renamed, so copies share no prefix)
-> scale the arrival rate -> mix in multimodal requests over the same span.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..rng import stream
from .readers import read_trace
from .source import RequestSource
from .synth.multimodal import generate_multimodal
from .synth.sessions import generate_sessions
from .transform import spread_buckets

if TYPE_CHECKING:
    from ..scenario import Workload


def tile(source: RequestSource, copies: int, span_s: float) -> RequestSource:
    """``copies`` back-to-back copies of ``source``, copy k shifted by k · span_s."""
    if copies == 1 or len(source) == 0:
        return source
    parts = [source.with_arrivals(source.arrival_s + k * span_s) for k in range(copies)]
    return RequestSource.merge(*parts, name=f"{source.name}x{copies}")


def build_source(cfg: Workload, seed: int) -> RequestSource:
    if cfg.sessions is not None:
        src = generate_sessions(cfg.sessions, seed)
    else:
        fmt = None if cfg.format == "auto" else cfg.format
        src = read_trace(cfg.trace, format=fmt, traffic_class=cfg.traffic_class)
    if cfg.sessions is None and cfg.spread.method != "none" and cfg.spread.window_s > 0:
        src = spread_buckets(src, cfg.spread.window_s, cfg.spread.method, stream(seed, "workload"))
    end = cfg.end_s if cfg.end_s is not None else math.inf
    if cfg.start_s > 0 or math.isfinite(end):
        whole = src
        src = src.window(cfg.start_s, end)
        if not len(src) and len(whole):
            raise ConfigError(
                "workload",
                f"the window start_s={cfg.start_s:g} .. end_s={end:g} holds no requests of "
                f"{whole.name} (its arrivals span {float(whole.arrival_s[0]):g} .. "
                f"{float(whole.arrival_s[-1]):g} s on its own clock)",
            )
    if cfg.max_requests is not None:
        src = src.head(cfg.max_requests)
    if cfg.repeat > 1 and len(src):
        last = float(src.arrival_s[-1])
        span = (end - cfg.start_s) if math.isfinite(end) else last + last / max(1, len(src) - 1)
        src = tile(src, cfg.repeat, span)
    if cfg.rate_scale != 1.0:
        src = src.scale_rate(cfg.rate_scale)
    if cfg.multimodal is not None:
        span = float(src.arrival_s[-1]) if len(src) else 0.0
        images = generate_multimodal(cfg.multimodal, span, seed, src.block_tokens)
        src = RequestSource.merge(src, images, name=f"{src.name}+{images.name}")
    if not len(src):
        # a run of nothing has no latency or throughput to report (every figure would be NaN)
        raise ConfigError("workload", f"the workload ({src.name}) has no requests")
    return src
