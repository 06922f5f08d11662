"""The ``workload`` section of a scenario — its schema — and the RequestSource it describes.

Order of operations: read the trace (or generate multi-day sessions) -> spread bucketed
timestamps -> cut the time window (on the trace's own clock) -> keep the first ``max_requests``
-> tile ``repeat`` copies end to end (each copy's block ids renamed, so copies share no prefix)
-> scale the arrival rate -> mix in multimodal requests over the same span.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from ..errors import ConfigError
from ..rng import stream
from ..validation import FrozenModel
from .builtin import BUILTIN_PREFIX, BUILTIN_TRACES
from .readers import read_trace
from .source import RequestSource
from .synth.multimodal import MultimodalWorkload, generate_multimodal
from .synth.sessions import CLASS_NAMES as SESSION_CLASSES
from .synth.sessions import SessionWorkload, generate_sessions
from .transform import spread_buckets

MAX_RATE_SCALE = 1e4  # workload.rate_scale
MAX_REPEAT = 10_000  # workload.repeat


class Spread(FrozenModel):
    method: Literal["uniform", "even", "none"] = "uniform"
    window_s: float = Field(
        3.0, ge=0, le=86400, description="width of one timestamp bucket in the trace"
    )


class Workload(FrozenModel):
    """Where requests come from and how the trace is replayed."""

    trace: str = "builtin:mooncake_conversation"
    sessions: SessionWorkload | None = Field(
        None,
        description="generate a multi-day chatbot/agent session workload "
        "(traces/synth/sessions.py) instead of reading `trace`; repeat and rate_scale apply to "
        "it too, but a --set that "
        "switches a trace scenario to sessions resets them to 1 (a trace's replay speed, e.g. "
        "default.yaml's 4 x 25, is not inherited) unless it sets them as well",
    )
    multimodal: MultimodalWorkload | None = Field(
        None, description="mix in image requests drawn from the ServeGen mm-image distributions"
    )
    format: Literal[
        "auto", "mooncake", "azure", "burstgpt", "qwen", "vidur", "tracelab", "parquet"
    ] = "auto"
    traffic_class: str | None = Field(None, description="override the trace's traffic class")
    start_s: float = Field(0.0, ge=0, description="window start on the trace's own clock")
    end_s: float | None = Field(None, gt=0, description="window end on the trace's own clock")
    max_requests: int | None = Field(None, ge=1, le=1_000_000_000)
    repeat: int = Field(
        1,
        ge=1,
        le=MAX_REPEAT,
        description="tile the windowed trace end to end (block hashes renamed per copy); "
        "reset to 1 when a --set switches the scenario to `sessions`",
    )
    rate_scale: float = Field(
        1.0,
        gt=0,
        le=MAX_RATE_SCALE,
        description="multiply the arrival rate; reset to 1 when a --set switches the scenario "
        "to `sessions`",
    )
    spread: Spread = Spread()

    @model_validator(mode="after")
    def _window(self) -> Workload:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError("end_s must be greater than start_s")
        return self

    def traffic_classes(self) -> tuple[str, ...] | None:
        """The traffic classes this workload can produce, where the config alone tells (a
        sessions generator, a builtin trace); None for a trace file, whose classes are its own."""
        builtin = self.trace.removeprefix(BUILTIN_PREFIX)
        if self.sessions is not None:
            names: tuple[str, ...] = SESSION_CLASSES
        elif self.trace.startswith(BUILTIN_PREFIX) and builtin in BUILTIN_TRACES:
            names = (self.traffic_class or BUILTIN_TRACES[builtin][2],)
        else:
            return None
        return names + ((self.multimodal.class_name,) if self.multimodal is not None else ())


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
