"""The throughput/interactivity front of a plan's search space.

Every shape the planner searched (pruned ones too: the front is over the whole space) gets a
steady-state curve, one point per decode batch from one sequence per rank to the most a rank
holds (``steady.decode_curve``): output tokens per second per GPU of the whole unit against
tokens per second each user sees. A disaggregated unit's output is its decode group's, capped by
what its prefill instances can feed (``bounds.prefill_tokens_per_s`` at the workload's mean new
tokens per request); an aggregated instance shares its GPUs between the two, so its output is
1 / (1 / decode + 1 / prefill) and each user's speed falls by the same share. Within a GPU
budget (``plan --gpus N``) a point's throughput is what the replicas that fit serve, over N.

The shapes the plan simulated are added as their own points (``simulated``): the operating
point's throughput per GPU, 1 / mean TPOT per user, its $/M output tokens and p99 TTFT — the
only points with a latency tail. ``pareto`` marks the steady points no other steady point beats
on both axes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from .analysis.steady import decode_curve
from .bounds import WorkloadStats, as_disaggregated, prefill_tokens_per_s
from .plan import Plan, ProbeBase, ShapeResult

FRONT_COLUMNS = (
    "deployment", "kind", "tok_s_per_gpu", "tok_s_per_user", "usd_per_m_tokens", "p99_ttft_s",
    "simulated", "pareto", "batch_per_gpu",
)  # fmt: skip


@dataclass(frozen=True)
class FrontPoint:
    deployment: str
    kind: str
    tok_s_per_gpu: float
    tok_s_per_user: float
    usd_per_m_tokens: float
    p99_ttft_s: float  # simulated points only
    simulated: bool
    pareto: bool = False
    batch_per_gpu: float = math.nan  # steady points: sequences per decode GPU


def steady_points(r: ShapeResult, base: ProbeBase, stats: WorkloadStats) -> list[FrontPoint]:
    """The steady-state curve of one searched shape (see the module notes)."""
    sc = base.shaped(r.shape)
    aggregated = sc.aggregated
    sd = as_disaggregated(sc) if aggregated else sc
    new_tokens = max(stats.new_tokens, 1.0)
    out_tokens = max(stats.output_tokens, 1.0)
    context = int(stats.input_tokens + stats.output_tokens / 2)
    prefill_rps = sd.pools.prefill.instances * prefill_tokens_per_s(sd, new_tokens) / new_tokens
    prefill_out = prefill_rps * out_tokens
    try:
        curve = decode_curve(sd, context)
    except UserError:  # not one sequence of the mean context fits a rank: no point
        return []
    budget = base.gpu_budget
    points = []
    for p in curve:
        decode_out = p.tokens_per_s_per_gpu * sd.pools.decode.gpus
        user = p.tokens_per_s_per_user
        if aggregated:
            unit_out = 1.0 / (1.0 / decode_out + 1.0 / prefill_out)
            user *= unit_out / decode_out
        else:
            unit_out = min(decode_out, prefill_out)
        per_gpu = unit_out / r.unit_gpus
        if budget is not None:
            per_gpu = (budget // r.unit_gpus) * unit_out / budget
        points.append(
            FrontPoint(
                r.shape.label,
                r.shape.kind,
                per_gpu,
                user,
                r.unit_usd_h / (unit_out * 3600 / 1e6),
                math.nan,
                False,
                batch_per_gpu=float(p.batch_per_gpu or math.nan),
            )
        )
    return points


def simulated_point(r: ShapeResult, plan: Plan) -> FrontPoint:
    """A feasible shape's operating point as simulated."""
    tok_s = r.rate_rps * plan.mean_output_tokens
    gpus = plan.gpu_budget if plan.gpu_budget is not None else r.replicas * r.unit_gpus
    return FrontPoint(
        r.shape.label,
        r.shape.kind,
        tok_s / gpus,
        r.tok_s_per_user,
        r.usd_per_mtok_output,
        r.ttft_p99_s,
        True,
    )


def pareto(points: list[FrontPoint]) -> list[FrontPoint]:
    """``points`` with ``pareto`` set on the steady points no other steady point beats on both
    throughput per GPU and tokens per second per user."""
    steady = sorted(
        (p for p in points if not p.simulated), key=lambda p: (-p.tok_s_per_user, -p.tok_s_per_gpu)
    )
    best_gpu, on_front = -math.inf, set()
    for p in steady:
        if p.tok_s_per_gpu > best_gpu:
            on_front.add(id(p))
            best_gpu = p.tok_s_per_gpu
    return [FrontPoint(**{**asdict(p), "pareto": id(p) in on_front}) for p in points]


def front(plan: Plan, base: ProbeBase, stats: WorkloadStats) -> list[FrontPoint]:
    """Every searched shape's steady curve and every simulated operating point."""
    points: list[FrontPoint] = []
    for r in plan.results:
        if r.status in ("over_budget", "error"):
            continue
        points += steady_points(r, base, stats)
    points += [simulated_point(r, plan) for r in plan.feasible()]
    return pareto(points)


def front_rows(points: list[FrontPoint]) -> list[dict[str, Any]]:
    return [asdict(p) for p in points]


def plot_front(points: list[FrontPoint], title: str, path: Path | None = None) -> int:
    """Two panels: throughput per GPU against tokens/s per user (every shape's steady curve in
    grey, the Pareto front in blue, simulated operating points as red stars), and $/M tokens
    against p99 TTFT of the simulated points. Written to ``path`` atomically; without one, the
    PNG's size in bytes."""
    import matplotlib

    from ..sim.results.files import close_png

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8))
    steady = [p for p in points if not p.simulated]
    by_shape: dict[str, list[FrontPoint]] = {}
    for p in steady:
        by_shape.setdefault(p.deployment, []).append(p)
    for curve in by_shape.values():
        ax.plot([p.tok_s_per_user for p in curve], [p.tok_s_per_gpu for p in curve],
                color="0.75", lw=0.8)  # fmt: skip
    best = sorted((p for p in steady if p.pareto), key=lambda p: p.tok_s_per_user)
    ax.plot([p.tok_s_per_user for p in best], [p.tok_s_per_gpu for p in best], "o-",
            color="tab:blue", ms=3, label="front (steady state)")  # fmt: skip
    for p in best[:: max(1, len(best) // 6)]:
        ax.annotate(p.deployment, (p.tok_s_per_user, p.tok_s_per_gpu), fontsize=7)
    sims = [p for p in points if p.simulated]
    ax.scatter([p.tok_s_per_user for p in sims], [p.tok_s_per_gpu for p in sims], marker="*",
               s=90, color="tab:red", zorder=3, label="simulated operating points")  # fmt: skip
    ax.set(xlabel="output tokens/s per user", ylabel="output tokens/s per GPU", title=title)
    if points:
        ax.set_xscale("log")
        ax.legend(fontsize=8, loc="upper right")
    else:
        ax.text(0.5, 0.5, "no shape within the search", ha="center", transform=ax.transAxes)
    bx.scatter([p.p99_ttft_s for p in sims], [p.usd_per_m_tokens for p in sims], marker="*",
               s=90, color="tab:red")  # fmt: skip
    for p in sims:
        bx.annotate(p.deployment, (p.p99_ttft_s, p.usd_per_m_tokens), fontsize=7)
    bx.set(xlabel="p99 TTFT at the operating point (s)", ylabel="$ per M output tokens",
           title="simulated points")  # fmt: skip
    fig.tight_layout()
    return close_png(fig, path)
