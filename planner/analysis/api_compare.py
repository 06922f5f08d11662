"""Self-hosting against the API: what a workload costs a day on the scenario's deployment,
resized hour by hour, against what the provider's API bills for the same tokens — and the
daily token volume at which the two cost the same.

The workload's **average day** (:func:`daily_shape`): its arrivals bucketed by hour of its
clock (hour 0: midnight; the sessions generator's day 0 starts at time 0), tokens of each
traffic class per hour, over a window of whole days after a cache warm-up (an hour the window
never covers, in a trace shorter than a day, takes the window's mean hour). Every volume
compared is this day scaled: the same hourly shape, class mix and hit rates, more or fewer
users.

**The API bill** (:func:`api_bill`): each class's input split by its prefix hit rate into
cache hits and misses, plus output, at ``prices.api``; each hour at its price factor
(:func:`price_factors`: peak or off-peak, averaged over a week). The hit rates are the one-pass
TTL sweep's (planner/analysis/ttl_sweep.py) at the API cache's retention, by default the
scenario's per-class TTLs (DeepSeek's: the API runs on the stack the article describes).

**Self-hosting** (:func:`self_hosted_day`): the scenario's pool shapes (a prefill instance of
``pools.prefill.ep`` GPUs, a decode group of ``pools.decode.ep``, vision encoders following
prefill in the scenario's ratio) resized every hour to the fewest that serve that hour's
prefill tokens (input the cache missed) and output tokens at ``planner.headroom`` of their
capacity, never fewer than ``compare_api.min_*``. An instance added for an hour starts
``spin_up_s`` before it and is paid from then; one idle for a gap shorter than its spin-up
keeps running (:func:`paid_hours`). The GPU-hours the resized pools leave idle against pools
sized for the peak hour all day are what a DeepSeek-style operator frees for other work.
Storage nodes (whole coding groups, at least one) hold the TTL's peak resident KV, scaled with
the volume, all day. Each TTL variant (the scenario's per-class TTLs and
``compare_api.ttl_variants_s``) changes the prefill work (what it misses), the storage and so
the cost; the API's hit rate stays its own.

**Capacity** (:func:`pool_capacity`): from the planner's steady model
(planner/analysis/steady.py) — a prefill instance at full ``max_tokens_per_step`` steps of the
workload's mean prompt after its mean cached prefix; a decode group at the largest batch that
gives each user the SLO's speed (1 / ``slo.tpot_s``, or ``slo.min_user_tok_s``) at the
workload's output-weighted mean context — or the figures ``compare_api`` sets (a simulation's).
No queueing, no tail latency: a steady-state figure, optimistic where traffic is bursty within
an hour (``planner.headroom`` is the margin).

**Break-even** (:func:`break_even`): scanning the volumes of ``compare_api.volume_range``,
the volume above which self-hosting is cheaper at every volume scanned, refined by bisection
between the two grid points around it; none when one side is cheaper over the whole range.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import UserError
from ...models.registry import load_hardware
from ...scenario import ApiPrices, Scenario, StoragePool
from ...traces import RequestSource
from . import steady
from .storage_sizing import block_bytes, nodes_for
from .ttl_sweep import ttl_sweep

HOURS = 24
HOUR_S = 3600.0
DAY_S = 86400.0
Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# ---- the workload's day ------------------------------------------------------------------------


@dataclass(frozen=True)
class DailyShape:
    """The workload's average day, hour by hour of its clock. ``covered_h[h]``: hours of the
    measured window that fell in hour h of a day (summed over its days); an hour never covered
    holds the window's mean hour (listed in :attr:`filled`)."""

    classes: tuple[str, ...]
    requests: Array  # (24,) requests per hour
    input_tokens: Array  # (classes, 24) input tokens per hour
    output_tokens: Array  # (24,) output tokens per hour
    covered_h: Array  # (24,)
    start_s: float
    end_s: float
    window_requests: int  # requests counted

    @property
    def filled(self) -> list[int]:
        return [h for h in range(HOURS) if self.covered_h[h] <= 0]

    @property
    def tokens_per_day(self) -> float:
        return float(self.input_tokens.sum() + self.output_tokens.sum())

    def as_dict(self) -> dict[str, Any]:
        return {
            "window_s": [self.start_s, self.end_s],
            "days": (self.end_s - self.start_s) / DAY_S,
            "requests_counted": self.window_requests,
            "hours_filled_with_the_mean": self.filled,
            "requests_per_day": float(self.requests.sum()),
            "input_tokens_per_day": float(self.input_tokens.sum()),
            "output_tokens_per_day": float(self.output_tokens.sum()),
            "tokens_per_day": self.tokens_per_day,
            "by_class_input_tokens_per_day": dict(
                zip(self.classes, self.input_tokens.sum(axis=1).tolist(), strict=True)
            ),
            "hourly": {
                "requests": self.requests.tolist(),
                "input_tokens": self.input_tokens.sum(axis=0).tolist(),
                "output_tokens": self.output_tokens.tolist(),
                "covered_hours": self.covered_h.tolist(),
            },
        }


def hour_coverage(start_s: float, end_s: float) -> Array:
    """Hours of ``[start_s, end_s)`` falling in each hour of the day, summed over its days."""
    k = np.arange(math.floor(start_s / HOUR_S), math.ceil(end_s / HOUR_S), dtype=np.int64)
    lo = np.maximum(k * HOUR_S, start_s)
    hi = np.minimum((k + 1) * HOUR_S, end_s)
    covered = np.clip(hi - lo, 0.0, None) / HOUR_S
    return np.bincount(k % HOURS, weights=covered, minlength=HOURS).astype(np.float64)


def in_window(t: Array, start_s: float, end_s: float) -> npt.NDArray[np.bool_]:
    """Arrivals counted in a window: ``[start, end)`` of whole days, or, in a window shorter
    than a day (it ends at the last arrival), ``[start, end]``."""
    return (t >= start_s) & ((t < end_s) if end_s - start_s >= DAY_S else (t <= end_s))


def daily_shape(source: RequestSource, start_s: float, end_s: float) -> DailyShape:
    """The average day of the requests arriving in the window (:func:`in_window`): each hour's
    sums divided by the hours of the window in that hour of the day."""
    t = source.arrival_s
    sel = in_window(t, start_s, end_s)
    covered = hour_coverage(start_s, end_s)
    total = float(covered.sum())
    if not sel.any() or total <= 0:
        raise UserError(
            f"compare-api: no requests spread over time in the window {start_s:,.0f} .. "
            f"{end_s:,.0f} s of the workload (it needs arrivals over a span to find a daily shape)"
        )
    hour = np.floor(t[sel] / HOUR_S).astype(np.int64) % HOURS
    classes = source.class_names
    code = source.traffic_class[sel].astype(np.int64)
    inp = source.input_len[sel].astype(np.float64)
    by_class = np.bincount(code * HOURS + hour, weights=inp, minlength=len(classes) * HOURS)

    def per_hour(sums: Array) -> Array:
        mean = sums.sum(axis=-1, keepdims=True) / total
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = sums / covered
        return np.where(covered > 0, rate, mean)

    return DailyShape(
        classes=classes,
        requests=per_hour(np.bincount(hour, minlength=HOURS).astype(np.float64)),
        input_tokens=per_hour(by_class.reshape(len(classes), HOURS).astype(np.float64)),
        output_tokens=per_hour(
            np.bincount(
                hour, weights=source.output_len[sel].astype(np.float64), minlength=HOURS
            ).astype(np.float64)
        ),
        covered_h=covered,
        start_s=float(start_s),
        end_s=float(end_s),
        window_requests=int(sel.sum()),
    )


# ---- the API bill -----------------------------------------------------------------------------


def price_factors(prices: ApiPrices, utc_offset_h: float) -> Array:
    """Per hour of the workload's clock, the API's price over its peak price, averaged over a
    week: on ``peak_days_per_week`` days the peak hours bill 1 and the rest ``off_peak_factor``,
    the other days ``off_peak_factor`` all day (computed minute by minute, so an hour that a
    fractional offset splits between a peak and an off-peak hour pays its share of each)."""
    minutes = np.arange(HOURS * 60, dtype=np.float64) / 60.0
    utc_hour = np.floor(minutes - utc_offset_h).astype(np.int64) % HOURS
    peak = np.isin(utc_hour, np.asarray(prices.peak_hours_utc, dtype=np.int64))
    off = prices.off_peak_factor
    share = prices.peak_days_per_week / 7.0
    per_minute = share * np.where(peak, 1.0, off) + (1.0 - share) * off
    return per_minute.reshape(HOURS, 60).mean(axis=1)


@dataclass(frozen=True)
class ApiBill:
    """USD per day the API bills, by the tokens that earned it."""

    input_cache_hit: float
    input_cache_miss: float
    output: float

    @property
    def total(self) -> float:
        return self.input_cache_hit + self.input_cache_miss + self.output

    def as_dict(self) -> dict[str, float]:
        return {
            "input_cache_hit": self.input_cache_hit,
            "input_cache_miss": self.input_cache_miss,
            "output": self.output,
            "total": self.total,
        }


def api_bill(
    shape: DailyShape, hit_rate: Array, prices: ApiPrices, factors: Array, scale: float = 1.0
) -> ApiBill:
    """The API's bill for ``scale`` times the day ``shape``, each class's input split by its hit
    rate (``hit_rate[c]``), each hour at its price factor."""
    hits = (shape.input_tokens * hit_rate[:, None]).sum(axis=0)
    misses = shape.input_tokens.sum(axis=0) - hits
    per_tok = scale / 1e6
    return ApiBill(
        input_cache_hit=float(
            (hits * factors).sum() * prices.input_cache_hit_per_mtok_usd * per_tok
        ),
        input_cache_miss=float((misses * factors).sum() * prices.input_per_mtok_usd * per_tok),
        output=float((shape.output_tokens * factors).sum() * prices.output_per_mtok_usd * per_tok),
    )


# ---- pools resized hour by hour ----------------------------------------------------------------


def instances_by_hour(demand_per_s: Array, capacity_per_s: float, minimum: int) -> IntArray:
    """Instances each hour: the fewest whose capacity covers the hour's demand, at least
    ``minimum`` (a tiny relative tolerance keeps an exact multiple from rounding up)."""
    need = np.ceil(demand_per_s / capacity_per_s * (1.0 - 1e-12)).astype(np.int64)
    return np.maximum(need, minimum)


def paid_hours(sizes: IntArray, spin_up_s: float) -> float:
    """Instance-hours paid in one day (the day repeating) for a pool of ``sizes[h]`` instances
    serving through hour h. Instance k serves in the hours where ``sizes > k``; between two of
    its serving spells, a gap of g hours costs min(g, spin-up): released and started again
    spin-up before it is needed, or kept running through a gap shorter than that."""
    spin_h = spin_up_s / HOUR_S
    total, below = 0.0, 0
    for level in np.unique(sizes[sizes > 0]):
        on = sizes >= level  # the pattern of every instance k with below <= k < level
        cost = float(on.sum())
        if not on.all():
            off = np.roll(~on, -int(np.argmax(on)))  # starts serving: no gap wraps around
            edges = np.diff(np.concatenate([[0], off.astype(np.int8), [0]]))
            gaps = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
            cost += float(np.minimum(gaps, spin_h).sum())
        total += (int(level) - below) * cost
        below = int(level)
    return total


@dataclass(frozen=True)
class Capacity:
    """What one prefill instance and one decode group serve at full load (before headroom),
    and where each figure comes from."""

    prefill_tok_s: float  # new prompt tokens per second per instance
    decode_tok_s: float  # output tokens per second per group
    prefill_source: str
    decode_source: str
    mean_prompt: int  # new tokens per request the prefill figure is for
    mean_cached: int
    decode_context: int
    decode_seqs_per_rank: float | None
    decode_limit: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefill_new_tok_s_per_instance": self.prefill_tok_s,
            "prefill_source": self.prefill_source,
            "prefill_mean_prompt_tokens": self.mean_prompt,
            "prefill_mean_cached_tokens": self.mean_cached,
            "decode_output_tok_s_per_group": self.decode_tok_s,
            "decode_source": self.decode_source,
            "decode_context_tokens": self.decode_context,
            "decode_seqs_per_rank": self.decode_seqs_per_rank,
            "decode_batch_limit": self.decode_limit,
        }


STEADY = "steady model (planner/analysis/steady.py)"


def user_speed(sc: Scenario) -> float:
    """The per-user output speed the SLOs ask for: 1 / ``tpot_s``, or ``min_user_tok_s``."""
    return max(1.0 / sc.slo.tpot_s, sc.slo.min_user_tok_s or 0.0)


def pool_capacity(sc: Scenario, mean_prompt: float, mean_cached: float, context: int) -> Capacity:
    """One prefill instance's and one decode group's capacity (see the module docstring)."""
    cfg = sc.compare_api
    pre = sc.pools.prefill
    prompt, cached = max(1, round(mean_prompt)), max(0, round(mean_cached))
    if cfg.prefill_tok_s_per_instance is not None:
        prefill, prefill_src = (
            cfg.prefill_tok_s_per_instance,
            "compare_api.prefill_tok_s_per_instance",
        )
    else:
        per_gpu = max(1, pre.max_tokens_per_step // pre.tp)
        if prompt <= per_gpu * pre.tp:
            point = steady.prefill_point(sc, per_gpu, prompt, cached)
        else:  # a prompt longer than a step: chunked (its cached prefix not charged)
            point = steady.chunked_prompt_point(sc, prompt, pre.max_tokens_per_step)
        prefill, prefill_src = point.tokens_per_s_per_gpu * pre.ep, STEADY
    seqs: float | None = None
    limit: str | None = None
    if cfg.decode_tok_s_per_group is not None:
        decode, decode_src = cfg.decode_tok_s_per_group, "compare_api.decode_tok_s_per_group"
    else:
        d = steady.decode_at_user_speed(sc, context, user_speed(sc))
        decode, decode_src = d.tokens_per_s_per_gpu * sc.pools.decode.ep, STEADY
        seqs = (d.batch_per_gpu or 0.0) * d.tp
        limit = d.batch_limit if d.meets_speed else "slower than the SLO even at one sequence"
    return Capacity(prefill, decode, prefill_src, decode_src, prompt, cached, context, seqs, limit)


@dataclass(frozen=True)
class PoolPrice:
    gpus_per_instance: int
    usd_per_gpu_hour: float


@dataclass(frozen=True)
class Fleet:
    """The scenario's pools as the comparison resizes them: GPUs per instance and $ per GPU-hour
    of each, the smallest sizes, the spin-up delay, the headroom, the storage nodes."""

    pools: dict[str, PoolPrice]  # prefill, decode and, where the scenario has one, vision
    min_prefill: int
    min_decode: int
    vision_per_prefill: float  # vision encoders per prefill instance
    spin_up_s: float
    headroom: float
    storage: StoragePool
    storage_node_usd_per_h: float

    @classmethod
    def of(cls, sc: Scenario) -> Fleet:
        p = sc.pools
        price = sc.prices.gpu_hour_usd

        def of(hw: str) -> float:
            return price[load_hardware(hw).name]

        pools = {
            "prefill": PoolPrice(p.prefill.ep, of(p.prefill.hardware)),
            "decode": PoolPrice(p.decode.ep, of(p.decode.hardware)),
        }
        if p.vision.instances:
            pools["vision"] = PoolPrice(1, of(p.vision.hardware))
        cfg = sc.compare_api
        return cls(
            pools=pools,
            min_prefill=cfg.min_prefill_instances,
            min_decode=cfg.min_decode_groups,
            vision_per_prefill=p.vision.instances / p.prefill.instances,
            spin_up_s=cfg.spin_up_s,
            headroom=sc.planner.headroom,
            storage=p.storage,
            storage_node_usd_per_h=sc.prices.storage_node_hour_usd,
        )


@dataclass(frozen=True)
class Variant:
    """One self-hosted KV-cache retention: its hit rate per class and peak resident KV."""

    label: str
    ttl_s: float | dict[str, float]
    hit_rate: Array  # (classes,)
    peak_resident_bytes: float
    storage: bool  # whether storage nodes hold it (False: no prefix cache, or in HBM/host)


@dataclass(frozen=True)
class SelfHostedDay:
    """One day self-hosted at ``scale`` times the workload's volume."""

    scale: float
    sizes: dict[str, IntArray]  # pool -> instances in each hour
    storage_nodes: int
    usd_per_day: float  # pools resized hour by hour
    static_usd_per_day: float  # every pool at its peak-hour size all day
    gpu_hours_paid: float
    gpu_hours_freed: float  # against the static pools

    def as_dict(self, volume: float) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "tokens_per_day": self.scale * volume,
            "usd_per_day": self.usd_per_day,
            "static_usd_per_day": self.static_usd_per_day,
            "gpu_hours_paid": self.gpu_hours_paid,
            "gpu_hours_freed": self.gpu_hours_freed,
            "storage_nodes": self.storage_nodes,
            "instances_by_hour": {k: v.tolist() for k, v in self.sizes.items()},
        }


def self_hosted_day(
    fleet: Fleet, shape: DailyShape, variant: Variant, cap: Capacity, scale: float
) -> SelfHostedDay:
    """Cost of one day at ``scale`` times ``shape`` on the fleet's pools resized hourly."""
    missed = (shape.input_tokens * (1.0 - variant.hit_rate)[:, None]).sum(axis=0)
    prefill = instances_by_hour(
        missed * scale / HOUR_S, cap.prefill_tok_s * fleet.headroom, fleet.min_prefill
    )
    decode = instances_by_hour(
        shape.output_tokens * scale / HOUR_S, cap.decode_tok_s * fleet.headroom, fleet.min_decode
    )
    sizes: dict[str, IntArray] = {"prefill": prefill, "decode": decode}
    if "vision" in fleet.pools:  # the encoders follow prefill in the scenario's ratio
        sizes["vision"] = np.ceil(prefill * fleet.vision_per_prefill * (1.0 - 1e-12)).astype(
            np.int64
        )
    store = fleet.storage
    nodes = (
        max(store.width, nodes_for(store, variant.peak_resident_bytes * scale))
        if variant.storage
        else 0
    )
    storage_usd = nodes * fleet.storage_node_usd_per_h * HOURS
    gpu_paid = gpu_static = usd = static = 0.0
    for name, n in sizes.items():
        pool = fleet.pools[name]
        paid = pool.gpus_per_instance * paid_hours(n, fleet.spin_up_s)
        peak = pool.gpus_per_instance * int(n.max()) * HOURS
        gpu_paid, gpu_static = gpu_paid + paid, gpu_static + peak
        usd, static = usd + paid * pool.usd_per_gpu_hour, static + peak * pool.usd_per_gpu_hour
    return SelfHostedDay(
        scale=scale,
        sizes=sizes,
        storage_nodes=nodes,
        usd_per_day=usd + storage_usd,
        static_usd_per_day=static + storage_usd,
        gpu_hours_paid=gpu_paid,
        gpu_hours_freed=gpu_static - gpu_paid,
    )


# ---- break-even --------------------------------------------------------------------------------


def break_even(
    scales: Array, self_minus_api: Callable[[float], float], steps: int = 60
) -> tuple[float | None, str]:
    """The scale above which self-hosting is cheaper at every scale of ``scales`` (ascending),
    bisected (in log scale) between the two grid points around the last crossing; None and why
    when one side is cheaper over the whole grid."""
    diff = np.array([self_minus_api(float(s)) for s in scales])
    dearer = np.flatnonzero(diff > 0)
    if not len(dearer):
        return None, f"self-hosting is cheaper at every volume from {scales[0]:g}x the workload's"
    i = int(dearer[-1])
    if i == len(scales) - 1:
        return (
            None,
            f"the API is cheaper at {scales[-1]:g}x the workload's volume, the largest compared",
        )
    lo, hi = math.log(scales[i]), math.log(scales[i + 1])
    for _ in range(steps):
        mid = (lo + hi) / 2.0
        if self_minus_api(math.exp(mid)) > 0:
            lo = mid
        else:
            hi = mid
    return math.exp(hi), "below it the API is cheaper, above it self-hosting"


# ---- the comparison ----------------------------------------------------------------------------


@dataclass(frozen=True)
class VariantResult:
    variant: Variant
    capacity: Capacity
    at_workload: SelfHostedDay
    curve: list[SelfHostedDay]
    break_even_scale: float | None
    break_even_note: str
    at_break_even: SelfHostedDay | None


@dataclass(frozen=True)
class ApiComparison:
    """Everything ``deepinfer-sim compare-api`` prints, plots and writes."""

    scenario: str
    shape: DailyShape
    price_factors: Array
    api_label: str
    api_hit_rate: Array
    api_at_workload: ApiBill
    scales: Array
    api_curve: Array  # USD per day at each scale
    variants: list[VariantResult]
    notes: list[str]
    deployment: str
    prices: ApiPrices
    settings: dict[str, Any]  # the configuration the comparison used

    def as_dict(self) -> dict[str, Any]:
        sc_volume = self.shape.tokens_per_day
        classes = self.shape.classes
        api_input = float(self.shape.input_tokens.sum())
        return {
            "scenario": self.scenario,
            "deployment": self.deployment,
            "workload": self.shape.as_dict(),
            "settings": self.settings,
            "api": {
                "prices": self.prices.model_dump(mode="json"),
                "cache": self.api_label,
                "hit_rate": _rates(classes, self.api_hit_rate, self.shape),
                "price_factor_by_hour": self.price_factors.tolist(),
                "usd_per_day": self.api_at_workload.as_dict(),
                "usd_per_mtok": self.api_at_workload.total / sc_volume * 1e6,
                "input_tokens_per_day": api_input,
            },
            "variants": [
                {
                    "label": r.variant.label,
                    "ttl_s": r.variant.ttl_s,
                    "hit_rate": _rates(classes, r.variant.hit_rate, self.shape),
                    "peak_resident_bytes": r.variant.peak_resident_bytes,
                    "capacity": r.capacity.as_dict(),
                    "at_workload": r.at_workload.as_dict(sc_volume),
                    "break_even": {
                        "scale": r.break_even_scale,
                        "tokens_per_day": (
                            None if r.break_even_scale is None else r.break_even_scale * sc_volume
                        ),
                        "note": r.break_even_note,
                        "self_hosted": (
                            None if r.at_break_even is None else r.at_break_even.as_dict(sc_volume)
                        ),
                    },
                    "curve_usd_per_day": [d.usd_per_day for d in r.curve],
                    "curve_static_usd_per_day": [d.static_usd_per_day for d in r.curve],
                    "curve_gpu_hours_freed": [d.gpu_hours_freed for d in r.curve],
                }
                for r in self.variants
            ],
            "curve": {
                "scales": self.scales.tolist(),
                "tokens_per_day": (self.scales * sc_volume).tolist(),
                "api_usd_per_day": self.api_curve.tolist(),
            },
            "notes": self.notes,
        }


def _rates(classes: tuple[str, ...], hit: Array, shape: DailyShape) -> dict[str, float]:
    inp = shape.input_tokens.sum(axis=1)
    out = dict(zip(classes, hit.tolist(), strict=True))
    out["all"] = float((inp * hit).sum() / inp.sum()) if inp.sum() > 0 else 0.0
    return out


def _ttl_label(seconds: float) -> str:
    if seconds == 0:
        return "no prefix cache"
    for unit, size in (("d", DAY_S), ("h", HOUR_S), ("min", 60.0)):
        if seconds >= size:
            return f"TTL {seconds / size:g} {unit}"
    return f"TTL {seconds:g} s"


def _window(
    sc: Scenario, source: RequestSource, longest_ttl: float, notes: list[str]
) -> tuple[float, float]:
    """The measured window: after the warm-up, whole days where there is at least one."""
    first, last = float(source.arrival_s[0]), float(source.arrival_s[-1])
    warm = sc.compare_api.warmup_s
    if warm is None:
        warm = longest_ttl if last - first >= longest_ttl + DAY_S else 0.0
        if warm == 0.0 and longest_ttl > 0:
            notes.append(
                f"the workload spans {(last - first) / DAY_S:.3g} days, less than a day beyond "
                f"the longest TTL compared ({longest_ttl / DAY_S:g} d): hit rates include its "
                "cold start"
            )
    start = max(first, warm)
    if start >= last:
        raise UserError(
            f"compare_api.warmup_s: {warm:g} s leaves no arrivals to count (the last arrives at "
            f"{last:,.0f} s)"
        )
    # a window whose last arrival falls in the last hour of a day counts that day whole (a
    # generator cuts its arrivals at its horizon: the last comes just before a whole day)
    days = math.floor((last - start) / DAY_S + 1.0 / HOURS)
    return (start, start + days * DAY_S) if days >= 1 else (start, last)


def _variants(
    sc: Scenario, source: RequestSource, start: float, end: float
) -> tuple[list[Variant], Variant]:
    """The self-hosted variants and the API's cache, from one TTL sweep over the window."""
    names = source.class_names
    store = sc.pools.storage
    class_ttl = {n: store.ttl_for(n) for n in names}
    api_ttl = sc.prices.api.cache_ttl_s
    uniform = sorted({*sc.compare_api.ttl_variants_s, *([api_ttl] if api_ttl else [])})
    past = end - start >= DAY_S and source.arrival_s[-1] >= end  # arrivals after the window
    cut = source.window(0.0, end) if past else source
    sweep = ttl_sweep(
        cut, uniform or [0.0], class_ttl=class_ttl, block_bytes=block_bytes(sc, source),
        measure_from_s=start,
    )  # fmt: skip
    frame = sweep.frame

    def pick(policy: str, ttl: float | None) -> tuple[Array, float]:
        rows = frame[(frame["policy"] == policy) & np.isinf(frame["capacity_blocks"])]
        if ttl is not None:
            rows = rows[rows["ttl_s"] == ttl]
        by = rows.set_index("traffic_class")
        hit = np.array([by.loc[n, "hit_tokens"] for n in names], dtype=np.float64)
        inp = np.array([by.loc[n, "input_tokens"] for n in names], dtype=np.float64)
        rate = np.divide(hit, inp, out=np.zeros_like(hit), where=inp > 0)
        return rate, float(by.loc["all", "peak_resident_bytes"])

    cached = sc.cache.prefix.enabled
    per_class = ", ".join(f"{n} {_ttl_label(t).removeprefix('TTL ')}" for n, t in class_ttl.items())
    rate, peak = pick("class_ttl", None)
    scenario = Variant(f"TTL {per_class}", class_ttl, rate, peak, store.nodes > 0)
    variants = [scenario] if cached else []
    for ttl in sc.compare_api.ttl_variants_s if cached else [0.0]:
        rate, peak = pick("ttl", ttl) if ttl > 0 else (np.zeros(len(names)), 0.0)
        variants.append(Variant(_ttl_label(ttl), ttl, rate, peak, ttl > 0 and store.nodes > 0))
    if api_ttl is None:
        api = Variant("cache TTL as the scenario's", class_ttl, scenario.hit_rate, 0.0, False)
    else:
        rate, _ = pick("ttl", api_ttl)
        api = Variant(f"cache {_ttl_label(api_ttl)}", api_ttl, rate, 0.0, False)
    return variants, api


def _decode_context(source: RequestSource, start: float, end: float) -> int:
    """Mean context a decode batch holds: each request's prompt plus half its output, weighted
    by its output (a sequence stays in the batch as long as it generates)."""
    sel = in_window(source.arrival_s, start, end)
    out = source.output_len[sel].astype(np.float64)
    ctx = source.input_len[sel] + out / 2.0
    return max(1, round(float((ctx * out).sum() / out.sum())))


def compare_api(sc: Scenario, source: RequestSource) -> ApiComparison:
    """Self-hosting ``source`` (the scenario's workload) on the scenario's pools, resized hour by
    hour, against the API at ``prices.api``, over ``compare_api.volume_range``."""
    if sc.aggregated:
        raise UserError(
            "compare-api sizes disaggregated prefill and decode pools; serving: aggregated is "
            "not supported"
        )
    if not len(source):
        raise UserError("compare-api: the workload has no requests")
    cfg = sc.compare_api
    notes: list[str] = []
    store = sc.pools.storage
    ttls = [*(store.ttl_for(n) for n in source.class_names), *cfg.ttl_variants_s]
    ttls += [sc.prices.api.cache_ttl_s] if sc.prices.api.cache_ttl_s else []
    start, end = _window(sc, source, max(ttls), notes)
    shape = daily_shape(source, start, end)
    if shape.filled:
        notes.append(
            f"the window covers {24 - len(shape.filled)} of 24 hours of the day: the other hours "
            "take its mean hour (a flat day)"
        )
    if not sc.cache.prefix.enabled:
        notes.append("cache.prefix.enabled is false: self-hosted without a prefix cache")
    variants, api = _variants(sc, source, start, end)
    factors = price_factors(sc.prices.api, cfg.clock_utc_offset_h)
    bill = api_bill(shape, api.hit_rate, sc.prices.api, factors)
    lo, hi = cfg.volume_range
    scales = np.geomspace(lo, hi, cfg.volume_points)
    context = _decode_context(source, start, end)
    results = []
    requests = float(shape.requests.sum())
    fleet = Fleet.of(sc)
    for v in variants:
        inp = shape.input_tokens.sum(axis=1)
        cached = float((inp * v.hit_rate).sum())
        cap = pool_capacity(sc, (inp.sum() - cached) / requests, cached / requests, context)

        def day(s: float, v: Variant = v, cap: Capacity = cap) -> SelfHostedDay:
            return self_hosted_day(fleet, shape, v, cap, s)

        def dearer(s: float, day: Callable[[float], SelfHostedDay] = day) -> float:
            return day(s).usd_per_day - bill.total * s

        scale, why = break_even(scales, dearer)
        results.append(
            VariantResult(
                variant=v,
                capacity=cap,
                at_workload=day(1.0),
                curve=[day(float(s)) for s in scales],
                break_even_scale=scale,
                break_even_note=why,
                at_break_even=None if scale is None else day(scale),
            )
        )
    p = sc.pools
    deployment = (
        f"prefill EP{p.prefill.ep} x n + decode EP{p.decode.ep} x m on {p.decode.hardware}"
        if p.prefill.hardware == p.decode.hardware
        else f"prefill EP{p.prefill.ep} ({p.prefill.hardware}) x n + decode EP{p.decode.ep} "
        f"({p.decode.hardware}) x m"
    )
    return ApiComparison(
        scenario=sc.name,
        shape=shape,
        price_factors=factors,
        api_label=api.label,
        api_hit_rate=api.hit_rate,
        api_at_workload=bill,
        scales=scales,
        api_curve=bill.total * scales,
        variants=results,
        notes=notes,
        deployment=deployment,
        prices=sc.prices.api,
        settings={
            "compare_api": sc.compare_api.model_dump(mode="json"),
            "planner_headroom": fleet.headroom,
            "pools": {k: vars(v) for k, v in fleet.pools.items()},
            "storage_node_hour_usd": fleet.storage_node_usd_per_h,
            "slo_user_tok_s": user_speed(sc),
        },
    )


def prices_text(p: ApiPrices) -> str:
    """The API's peak prices in one phrase."""
    return (
        f"${p.input_per_mtok_usd:g} miss / ${p.input_cache_hit_per_mtok_usd:g} hit / "
        f"${p.output_per_mtok_usd:g} output per M at peak"
    )


# ---- the plot ----------------------------------------------------------------------------------


def _si(x: float, prefix: str = "", sep: str = " ") -> str:
    """1.2e11 -> "120 B"; with prefix "$" and no separator: "$120B"."""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{prefix}{x / size:.3g}{sep}{suffix}"
    return f"{prefix}{x:.3g}"


def plot_compare_api(res: ApiComparison, path: str | Path) -> Path:
    """Cost per day against daily token volume: the API line, one self-hosted line per TTL
    variant, each break-even marked, the workload's own volume dotted (log-log)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    volume = res.shape.tokens_per_day
    x = res.scales * volume
    fig = Figure(figsize=(9.0, 5.6))
    ax = fig.subplots()
    api_hits = _rates(res.shape.classes, res.api_hit_rate, res.shape)["all"]
    ax.plot(
        x,
        res.api_curve,
        color="tab:orange",
        lw=2.6,
        label=f"API, {prices_text(res.prices)} ({api_hits:.0%} cache hits)",
    )
    styles = ("-", "--", ":")
    # labels alternate below-right and above-left of their dots, clear of the lines
    offsets = ((18, -42, "left"), (-18, 30, "right"), (18, -80, "left"))
    for r, style, (dx, dy, ha) in zip(res.variants, styles, offsets, strict=False):
        hits = _rates(res.shape.classes, r.variant.hit_rate, res.shape)["all"]
        label = f"self-hosted, {r.variant.label} ({hits:.0%} hits)"
        ax.plot(x, [d.usd_per_day for d in r.curve], style, color="tab:blue", lw=2.0, label=label)
        if r.break_even_scale is not None:
            bx = r.break_even_scale * volume
            by = res.api_at_workload.total * r.break_even_scale
            ax.plot([bx], [by], "o", color="black", ms=7, zorder=5)
            ax.annotate(
                f"break-even {_si(bx)} tok/day\n({r.variant.label})",
                (bx, by),
                xytext=(dx, dy),
                textcoords="offset points",
                ha=ha,
                fontsize=9.5,
                fontweight="bold",
                arrowprops={"arrowstyle": "-", "color": "black", "lw": 0.8},
            )
    ax.axvline(volume, color="grey", ls=":", lw=1.2)
    ax.annotate(
        f"this workload\n{_si(volume)} tok/day",
        (volume, 0.97),
        xycoords=("data", "axes fraction"),
        xytext=(4, 0),
        textcoords="offset points",
        va="top",
        fontsize=9,
        color="dimgrey",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _si(v)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _si(v, "$", "")))
    ax.set_xlabel("daily token volume (input + output tokens per day)", fontsize=11)
    ax.set_ylabel("cost per day (USD)", fontsize=11)
    ax.set_title(
        f"{res.scenario}: self-hosting vs the API — API cheaper left of each dot, "
        "self-hosting right\n"
        f"{res.deployment}, resized hourly; same daily shape and mix at every volume",
        fontsize=10.5,
    )
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    ax.legend(loc="lower right", fontsize=9.5, framealpha=0.95)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    return out
