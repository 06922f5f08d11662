"""The numbers of a what-if report: the headline verdict, the metric rows and how they read.

The headline answers three questions from ``summary.json`` and the run's SLOs. *Does it meet its
SLOs at this load?* By the planner's rule (``planner/plan.py``): p99 TTFT, p99 TPOT (and p99 E2E
when set) within their limits and every arrived request served. *Which pool binds?* The one
nearest full: prefill and vision by their busy fraction; decode by its occupancy (the larger of
its batch-slot and KV fill), because a Wide-EP group steps whenever it holds one sequence and so
reads ~100 % busy at any load. *Headroom?* One minus the binding pool's fraction, said as "under
0.01 %" or "none" once it is that small (a pool 99.9996 % busy is saturated, not 0.00040 % short
of it).

*Did it keep up with its load?* Not when requests went unserved (rejected, or still in flight at
the end), and not when the backlog grew: at some moment at least ``BACKLOG_SHARE`` of all the
requests offered (and at least ``BACKLOG_MIN``) were waiting at one stage for capacity, the
summary's peak queue depth. A deployment that keeps up holds a few requests waiting at a time,
whatever the run's length; one offered more than it serves accumulates the excess, (1 - served
rate / offered rate) of the requests by the last arrival. A short overloaded run can still meet
its latency SLOs (the backlog drains before it is judged), which is why this is asked apart.
Cost per token and revenue per GPU-hour divide by the tokens the run served in its makespan: for
a run that did not keep up, or that missed its SLOs, they are the figures of a saturated (or
too slow) deployment, lower per token than serving that load within the SLOs would cost, so the
report puts a caveat on them (:func:`cost_caveat`).

Served / offered compares like with like: the requests served of the requests offered (a run
that served 200 of 200 reads 100 %: the summary's ``completed_fraction``). The summary's
``served_over_offered`` is the same count weighted by output tokens, over the same window (the
whole run), so it reads 1 for that run too.

Percentages keep two significant figures below 1 % (a store 0.0048 % full is not "0.00 %").
A change between two runs is coloured better or worse only when both were offered the same load
(:func:`same_offered_load`): more throughput from more offered traffic is not an improvement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# (section, label, key path in summary.json, unit kind, direction: +1 higher is better,
#  -1 lower is better, 0 neither)
Metric = tuple[str, str, tuple[str, ...], str, int]

OFFERED_TOLERANCE = 0.01  # relative: offered loads this close count as equal
NEGLIGIBLE = 0.001  # relative: a smaller change is not coloured (it reads +0.0 %)
BACKLOG_SHARE = 0.10  # of the requests offered waiting at once at one stage: it did not keep up
BACKLOG_MIN = 10  # requests: fewer waiting is never called a backlog (a burst in a tiny run)
HEADROOM_SHOWN_FROM = 1e-4  # a smaller headroom reads "under 0.01 %"
CAVEATED_COSTS = frozenset(
    {"usd_per_mtok_output", "revenue_usd_per_hour", "revenue_per_gpu_hour_usd"}
)


def _latency_rows() -> list[Metric]:
    rows: list[Metric] = []
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E")):
        for stat in ("mean", "p50", "p90", "p99"):
            rows.append(("Latency", f"{name} {stat}", ("latency", key, stat), "ms", -1))
    return rows


COST_METRICS: list[Metric] = [
    ("Cost", "GPUs", ("cost", "gpus", "total"), "int", 0),
    ("Cost", "prefill GPUs", ("cost", "gpus", "prefill"), "int", 0),
    ("Cost", "decode GPUs", ("cost", "gpus", "decode"), "int", 0),
    ("Cost", "vision GPUs", ("cost", "gpus", "vision"), "int", 0),
    ("Cost", "aggregated GPUs", ("cost", "gpus", "aggregated"), "int", 0),
    ("Cost", "storage nodes", ("cost", "storage_nodes"), "int", 0),
    ("Cost", "$ / hour", ("cost", "usd_per_hour"), "usd", -1),
    ("Cost", "$ / M output tokens", ("cost", "usd_per_mtok_output"), "usd", -1),
    ("Cost", "revenue $ / hour", ("cost", "revenue_usd_per_hour"), "usd", +1),
    ("Cost", "revenue $ / GPU-hour", ("cost", "revenue_per_gpu_hour_usd"), "usd", +1),
]

DETAIL_METRICS: list[Metric] = [
    ("Requests", "arrived", ("requests", "arrived"), "int", 0),
    ("Requests", "completed", ("requests", "completed"), "int", +1),
    ("Requests", "rejected", ("requests", "rejected"), "int", -1),
    ("Requests", "in flight at end", ("requests", "in_flight"), "int", -1),
    ("Requests", "offered requests / s", ("offered_load", "offered", "request_per_s"), "num", 0),
    ("Requests", "served / offered requests", ("offered_load", "completed_fraction"), "pct", +1),
    *_latency_rows(),
    ("Throughput", "requests / s", ("throughput", "request_per_s"), "num", +1),
    ("Throughput", "input tok / s", ("throughput", "input_tok_per_s"), "num", +1),
    ("Throughput", "output tok / s", ("throughput", "output_tok_per_s"), "num", +1),
    ("Throughput", "output tok / s / GPU", ("throughput", "output_tok_per_s_per_gpu"), "num", +1),
    ("Throughput", "peak output tok / s", ("throughput", "peak_output_tok_per_s"), "num", +1),
    ("Throughput", "makespan (s)", ("throughput", "duration_s"), "num", 0),
    ("Goodput", "requests / s within SLOs", ("goodput", "request_per_s"), "num", +1),
    ("Goodput", "share of completed within SLOs", ("goodput", "fraction_of_completed"), "pct", +1),
    ("Load", "aggregated busy", ("load", "aggregated", "busy_fraction"), "pct", 0),
    ("Load", "aggregated step-token fill", ("load", "aggregated", "step_token_fill"), "pct", 0),
    ("Load", "prefill stall (mean)", ("load", "aggregated", "prefill_stall_s_mean"), "ms", -1),
    ("Load", "prefill busy", ("load", "prefill", "busy_fraction"), "pct", 0),
    ("Load", "prefill step-token fill", ("load", "prefill", "step_token_fill"), "pct", 0),
    ("Load", "prefill queue (mean)", ("load", "prefill", "queue", "mean"), "num", -1),
    ("Load", "decode busy", ("load", "decode", "busy_fraction"), "pct", 0),
    ("Load", "decode batch-slot fill", ("load", "decode", "batch_fill"), "pct", 0),
    ("Load", "decode KV reserved", ("load", "decode", "kv_reserved_fraction_mean"), "pct", 0),
    ("Load", "decode queue (mean)", ("load", "decode", "queue", "mean"), "num", -1),
    ("Load", "vision busy", ("load", "vision", "busy_fraction"), "pct", 0),
    ("Prefix cache", "token hit rate", ("cache", "hit_rate_tokens"), "pct", +1),
    ("Expert balance", "prefill imbalance (mean)", ("eplb", "prefill_imbalance_mean"), "x", -1),
    ("Expert balance", "decode imbalance (mean)", ("eplb", "decode_imbalance_mean"), "x", -1),
    ("KV storage", "nodes", ("storage", "nodes"), "int", 0),
    ("KV storage", "logical capacity (TB)", ("storage", "logical_tb"), "num", 0),
    ("KV storage", "used (end)", ("storage", "used_fraction"), "pct", 0),
    ("KV storage", "used (peak)", ("storage", "used_fraction_peak"), "pct", 0),
    ("KV storage", "peak read GB/s", ("storage", "read_gbps_peak"), "num", 0),
    ("KV storage", "read latency p99", ("storage", "read_latency_s", "p99"), "ms", -1),
    ("KV storage", "lost blocks", ("storage", "lost_blocks"), "int", -1),
    ("Simulation", "seed", ("sim", "seed"), "id", 0),
    ("Simulation", "simulated s", ("sim", "simulated_s"), "num", 0),
    ("Simulation", "events", ("sim", "events"), "int", 0),
    ("Simulation", "wall s", ("sim", "wall_s"), "num", 0),
]


def get(summary: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def num(v: Any) -> float | None:
    """``v`` as a float when it is a finite number, else None."""
    return float(v) if is_num(v) else None


# ---- formatting ---------------------------------------------------------------------------------


def _sig(v: float, digits: int = 4) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    text = f"{v:,.{digits}g}"
    if "e" in text:
        return f"{v:.3e}"
    return text


def percent_number(fraction: float) -> str:
    """``fraction`` in percent without the sign: two decimals from 1 %, two significant figures
    below (0.0048), none for a whole number (100, 0)."""
    x = fraction * 100
    if x == round(x) and abs(x) < 1e6:
        return f"{x:.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    decimals = 1 - math.floor(math.log10(abs(x)))  # two significant figures
    return f"{x:.{decimals}f}"


def fmt(v: Any, kind: str) -> str:
    if v is None:
        return "–"
    if not is_num(v):
        return str(v)
    if kind == "ms":
        return f"{_sig(v * 1e3)} ms"
    if kind == "pct":
        return f"{percent_number(v)} %"
    if kind == "usd":
        return f"${v:,.2f}" if abs(v) >= 1 else f"${_sig(v, 3)}"
    if kind in ("int", "id"):
        return f"{v:,}" if kind == "int" else str(v)
    if kind == "x":
        return f"{v:.4f}"
    return _sig(float(v))


def short_pct(fraction: float) -> str:
    """A percentage for a sentence: whole from 10 %, one decimal from 1 %, two significant
    figures below."""
    x = fraction * 100
    if abs(x) >= 10:
        return f"{x:.0f} %"
    if abs(x) >= 1:
        return f"{x:.1f} %"
    return f"{percent_number(fraction)} %"


def headroom_text(fraction: float) -> str:
    """A headroom for a sentence: "none" at 0, "under 0.01 %" below that, else a percentage
    (two significant figures below 1 %)."""
    if fraction <= 0:
        return "none"
    if fraction < HEADROOM_SHOWN_FROM:
        return "under 0.01 %"
    return short_pct(fraction)


def seconds(v: float) -> str:
    """A duration the way a person says it: 534 ms, 5 s, 850 µs."""
    if v == 0:
        return "0 s"
    if abs(v) >= 1:
        return f"{v:.3g} s"
    if abs(v) >= 1e-3:
        return f"{v * 1e3:.3g} ms"
    return f"{v * 1e6:.3g} µs"


# ---- comparisons --------------------------------------------------------------------------------


def offered_load(summary: dict[str, Any]) -> dict[str, float] | None:
    """Offered requests, input and output tokens per second (None: not recorded)."""
    offered = get(summary, ("offered_load", "offered"))
    if not isinstance(offered, dict):
        return None
    keys = ("request_per_s", "input_tok_per_s", "output_tok_per_s")
    if not all(is_num(offered.get(k)) for k in keys):
        return None
    return {k: float(offered[k]) for k in keys}


def same_offered_load(
    a: dict[str, Any], b: dict[str, Any], rel_tol: float = OFFERED_TOLERANCE
) -> bool:
    """Whether two runs were offered the same load (requests and tokens per second within
    ``rel_tol``): only then does a change in their results say one deployment is better."""
    la, lb = offered_load(a), offered_load(b)
    if la is None or lb is None:
        return False
    return all(math.isclose(la[k], lb[k], rel_tol=rel_tol) for k in la)


def delta(a: Any, b: Any, kind: str, better: int, colour: bool = True) -> tuple[str, str]:
    """(text, css class) of ``b`` against the reference ``a``; the class is ``better`` or
    ``worse`` only when ``colour`` (equal offered load), the metric has a direction and the
    change is not negligible."""
    if kind == "id" or not (is_num(a) and is_num(b)):
        return "–", "na"
    d = b - a
    if d == 0:
        return "=", "same"
    if kind == "pct":
        absolute = ("+" if d > 0 else "−") + f"{percent_number(abs(d))} pp"
    else:
        absolute = ("+" if d > 0 else "−") + fmt(abs(d), kind)
    rel = f" ({d / abs(a) * 100:+.1f} %)" if a != 0 else ""
    negligible = a != 0 and abs(d / a) < NEGLIGIBLE
    if better == 0 or not colour or negligible:
        cls = "same"
    else:
        cls = "better" if d * better > 0 else "worse"
    return absolute + rel, cls


# ---- the headline -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SloCheck:
    name: str
    measured: float | None  # None: nothing to judge (no request with this latency)
    limit: float
    kind: str  # "s": a latency; "n": a count of requests
    key: str  # what the planner calls a miss of it (one of ``MISS_ORDER``)

    @property
    def met(self) -> bool:
        return self.measured is None or self.measured <= self.limit

    @property
    def use(self) -> float:
        """Measured over limit (0 when there is nothing to judge)."""
        if self.measured is None:
            return 0.0
        return self.measured / self.limit if self.limit else (0.0 if self.met else math.inf)


@dataclass(frozen=True)
class PoolLoad:
    pool: str
    fraction: float  # how full, the number that decides which pool binds
    measure: str  # what ``fraction`` is
    detail: str


@dataclass(frozen=True)
class Backlog:
    """The most requests waiting at once at one stage, when that was a backlog (see the module
    note): ``peak`` requests, ``share`` of the ``offered`` requests."""

    stage: str
    peak: int
    offered: int

    @property
    def share(self) -> float:
        return self.peak / self.offered


@dataclass(frozen=True)
class Headline:
    checks: list[SloCheck]
    pools: list[PoolLoad]
    offered_rps: float | None
    backlog: Backlog | None = None

    @property
    def meets(self) -> bool:
        return all(c.met for c in self.checks)

    @property
    def unserved(self) -> int:
        """Requests rejected or still in flight at the end."""
        return sum(int(c.measured or 0) for c in self.checks if c.kind == "n")

    @property
    def kept_up(self) -> bool:
        """Served every request without a growing backlog (the module note says how)."""
        return self.unserved == 0 and self.backlog is None

    @property
    def missed(self) -> list[SloCheck]:
        return [c for c in self.checks if not c.met]

    @property
    def tightest(self) -> SloCheck | None:
        latencies = [c for c in self.checks if c.kind == "s"]
        return max(latencies, key=lambda c: c.use) if latencies else None

    @property
    def binding(self) -> PoolLoad | None:
        return max(self.pools, key=lambda p: p.fraction) if self.pools else None

    @property
    def headroom(self) -> float | None:
        b = self.binding
        return None if b is None else max(0.0, 1.0 - b.fraction)


MISS_ORDER = ("rejections", "ttft", "tpot", "e2e")  # the planner names the first one missed


def slo_checks(summary: dict[str, Any], slo: dict[str, Any]) -> list[SloCheck]:
    """The SLO rule the planner holds a run to and the report shows, check by check: every
    request served, and the p99 of each latency that has an SLO within it. A latency no request
    has (TPOT when every output is one token, E2E in a summary without it) is not judged."""
    checks = []
    ttft, tpot, e2e = num(slo.get("ttft_s")), num(slo.get("tpot_s")), num(slo.get("e2e_s"))
    min_user_tok_s = num(slo.get("min_user_tok_s"))
    if min_user_tok_s:
        tpot = 1.0 / min_user_tok_s if tpot is None else min(tpot, 1.0 / min_user_tok_s)
    for name, key, limit in (("TTFT", "ttft", ttft), ("TPOT", "tpot", tpot), ("E2E", "e2e", e2e)):
        if limit is not None:
            p99 = num(get(summary, ("latency", f"{key}_s", "p99")))
            checks.append(SloCheck(f"p99 {name}", p99, limit, "s", key))
    req = summary.get("requests") or {}
    unserved = sum(int(req.get(k) or 0) for k in ("rejected", "in_flight"))
    checks.append(SloCheck("requests not served", float(unserved), 0.0, "n", "rejections"))
    return checks


def pool_loads(summary: dict[str, Any]) -> list[PoolLoad]:
    """How full each pool was (``load`` section; older summaries: busy fractions only)."""
    load = summary.get("load")
    out = []
    if not isinstance(load, dict):
        for pool, value in (summary.get("utilization") or {}).items():
            busy = num(value)
            if busy is not None:
                out.append(PoolLoad(pool, busy, "busy", f"{short_pct(busy)} busy"))
        return out
    agg = load.get("aggregated")
    if isinstance(agg, dict):
        return _aggregated_loads(load, agg)
    for pool in ("prefill", "vision"):
        busy = num(get(load, (pool, "busy_fraction")))
        if busy is not None:
            detail = f"{short_pct(busy)} busy"
            fill = num(get(load, (pool, "step_token_fill")))
            if fill is not None:
                detail += f", steps filled {short_pct(fill)} of their token budget"
            out.append(PoolLoad(pool, busy, "busy", detail))
    dec = load.get("decode")
    if isinstance(dec, dict):
        found = (
            (num(dec.get("batch_fill")), "batch slots"),
            (num(dec.get("kv_reserved_fraction_mean")), "KV"),
        )
        parts = [(v, name) for v, name in found if v is not None]
        if parts:
            fraction, measure = max(parts)
            detail = ", ".join(
                f"{name} {short_pct(v)} {'full' if name == 'batch slots' else 'reserved'}"
                for v, name in parts
            )
            busy = num(dec.get("busy_fraction"))
            if busy is not None:
                detail += f"; {short_pct(busy)} busy (it steps while it holds any sequence)"
            out.append(PoolLoad("decode", fraction, measure, detail))
    return out


def _aggregated_loads(load: dict[str, Any], agg: dict[str, Any]) -> list[PoolLoad]:
    """Aggregated serving: the vision encoders and one pool, as full as the most of the share
    of time it spent in steps that carried prompts (every step does once prompts queue), its
    batch slots and its KV reservation. Its busy time is no measure: it steps whenever it holds
    one sequence."""
    out = []
    vision = num(get(load, ("vision", "busy_fraction")))
    if vision is not None:
        out.append(PoolLoad("vision", vision, "busy", f"{short_pct(vision)} busy"))
    dec = load.get("decode")
    if not isinstance(dec, dict):
        dec = {}
    busy = num(agg.get("busy_fraction"))
    chunks = num(get(load, ("prefill", "busy_fraction")))
    found = (
        (chunks, "time in prefill steps"),
        (num(dec.get("batch_fill")), "batch slots"),
        (num(dec.get("kv_reserved_fraction_mean")), "KV"),
    )
    parts = [(v, name) for v, name in found if v is not None]
    if not parts:
        return out
    fraction, measure = max(parts)
    details = []
    if chunks is not None:
        details.append(f"{short_pct(chunks)} of the time in steps with prefill chunks")
    if busy is not None:
        details.append(f"{short_pct(busy)} busy")
    fill = num(agg.get("step_token_fill"))
    if fill is not None:
        details.append(f"steps filled {short_pct(fill)} of their token budget")
    details += [
        f"{name} {short_pct(v)} {'full' if name == 'batch slots' else 'reserved'}"
        for v, name in parts
        if name in ("batch slots", "KV")
    ]
    out.append(PoolLoad("aggregated", fraction, measure, ", ".join(details)))
    return out


QUEUES = (("vision", "vision"), ("prefill", "prefill"), ("decode", "decode"))


def backlog(summary: dict[str, Any]) -> Backlog | None:
    """The deepest queue of the run (``load.<pool>.queue.max``) when it held at least
    ``BACKLOG_SHARE`` of the requests offered and at least ``BACKLOG_MIN``; else None."""
    offered = num(get(summary, ("requests", "arrived")))
    if not offered:
        return None
    peaks = [
        (peak, stage)
        for key, stage in QUEUES
        if (peak := num(get(summary, ("load", key, "queue", "max")))) is not None
    ]
    if not peaks:
        return None
    peak, stage = max(peaks)
    if peak < BACKLOG_MIN or peak < BACKLOG_SHARE * offered:
        return None
    return Backlog(stage, int(peak), int(offered))


def headline(summary: dict[str, Any], slo: dict[str, Any]) -> Headline:
    offered = offered_load(summary)
    return Headline(
        checks=slo_checks(summary, slo),
        pools=pool_loads(summary),
        offered_rps=None if offered is None else offered["request_per_s"],
        backlog=backlog(summary),
    )


def backlog_text(h: Headline) -> str:
    """What the headline says of a run whose backlog grew ("" when it did not)."""
    b = h.backlog
    if b is None:
        return ""
    text = (
        f"It did not keep up with this load: up to {b.peak:,} requests ({short_pct(b.share)} of "
        f"the {b.offered:,} offered) waited for {b.stage} at once. "
    )
    if h.meets:
        return text + (
            "It meets its SLOs only because the queue drained after the last arrival; a longer "
            "run at this rate waits longer."
        )
    return text + "A longer run at this rate waits longer."


def cost_caveat(summary: dict[str, Any], h: Headline) -> str | None:
    """What the per-token cost and the revenue mean for a run that did not keep up with its load
    or missed its SLOs (None for a run that kept up and met them): they divide by the tokens the
    run served, so they are the figures of a saturated (or too slow) deployment, not what serving
    this load within the SLOs costs."""
    if h.meets and h.kept_up:
        return None
    why = []
    if h.backlog is not None:
        b = h.backlog
        why.append(f"its backlog grew (up to {b.peak:,} requests waiting for {b.stage})")
    if h.unserved:
        why.append(f"{h.unserved:,} requests were not served")
    latencies = [describe(c) for c in h.missed if c.kind == "s"]
    if latencies:
        why.append("it missed " + ", ".join(latencies))
    if h.kept_up:
        return (
            f"At this load {'; '.join(why)}. Its $ / M output tokens and revenue are those of a "
            "deployment that misses its SLOs, not what serving this load within them costs "
            "(that takes another deployment, usually a larger one)."
        )
    served = num(get(summary, ("throughput", "output_tok_per_s")))
    offered = num(get(summary, ("offered_load", "offered", "output_tok_per_s")))
    rate = ""
    if served is not None and offered is not None:
        rate = (
            f" ({_sig(served)} output tokens/s over its makespan, against {_sig(offered)}/s "
            "offered while requests arrived)"
        )
    return (
        f"It did not keep up with its load: {'; '.join(why)}. Its $ / M output tokens and revenue "
        f"count the tokens it served, at the rate it could serve them{rate}: the figures of a "
        "saturated deployment, lower per token than serving this load within its SLOs would cost "
        "(that needs more capacity)."
    )


def verdict(h: Headline) -> str:
    """One sentence: met or missed, at what offered load, and what missed."""
    at = f" at {_sig(h.offered_rps)} requests/s offered" if h.offered_rps is not None else ""
    if h.meets:
        return f"Meets its SLOs{at}."
    missed = "; ".join(describe(c) for c in h.missed)
    return f"Misses its SLOs{at}: {missed}."


def describe(c: SloCheck) -> str:
    if c.kind == "n":
        return f"{c.measured:,.0f} {c.name}" if c.measured is not None else c.name
    if c.measured is None:
        return f"{c.name} not judged (no request has it)"
    sign = "≤" if c.met else ">"
    return f"{c.name} {seconds(c.measured)} {sign} {seconds(c.limit)}"
