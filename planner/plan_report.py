"""A plan's outputs: plan.json, shapes.csv, the cost-vs-latency frontier plot, the terminal table,
and the delta of a what-if plan against the base plan."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from .front import FRONT_COLUMNS, front_rows, plot_front
from .plan import Plan


def delta(plan: Plan, base: Plan) -> dict[str, Any]:
    """What changed in the recommendation between ``base`` and ``plan``."""
    a, b = base.best, plan.best
    if a is None or b is None:
        return {"base": a.shape.label if a else None, "what_if": b.shape.label if b else None}
    return {
        "base": f"{a.shape.label} × {a.replicas}",
        "what_if": f"{b.shape.label} × {b.replicas}",
        "usd_h": b.usd_h - a.usd_h,
        "usd_h_pct": 100 * (b.usd_h / a.usd_h - 1),
        "gpus": b.replicas * b.unit_gpus - a.replicas * a.unit_gpus,
        "storage_nodes": plan.storage_nodes - base.storage_nodes,
        "ttft_p99_s": b.ttft_p99_s - a.ttft_p99_s,
        "usd_per_mtok_output": b.usd_per_mtok_output - a.usd_per_mtok_output,
    }


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def write_plan(plan: Plan, out: Path, base: Plan | None = None) -> None:
    """plan.json, shapes.csv and frontier.png, each atomically (never a 0-byte plan.json), in
    that order; a failure is one OutputError saying what was written (sim/results/files.py)."""
    from ..sim.results.files import Output, text_output, write_outputs

    doc = plan.to_dict()
    if base is not None:
        doc["delta"] = delta(plan, base)
    shapes = pd.DataFrame([r.row() for r in plan.results]).to_csv(index=False)
    front = pd.DataFrame(front_rows(plan.front), columns=list(FRONT_COLUMNS)).to_csv(index=False)
    title = _front_title(plan)
    write_outputs(
        out,
        [
            text_output("plan.json", json.dumps(_finite(doc), indent=1) + "\n"),
            text_output("shapes.csv", shapes),
            text_output("front.csv", front),
            Output("frontier.png", lambda p: _plot_frontier(plan, p), lambda: _plot_frontier(plan)),
            Output(
                "front.png",
                lambda p: plot_front(plan.front, title, p),
                lambda: plot_front(plan.front, title),
            ),
        ],
    )


def _front_title(plan: Plan) -> str:
    if plan.gpu_budget is not None:
        return f"within {plan.gpu_budget} GPUs: throughput per GPU of the budget"
    return "throughput per GPU against speed per user"


def _plot_frontier(plan: Plan, path: Path | None = None) -> int:
    """The cost-vs-latency plot into ``path`` (atomically); without one, its size in bytes."""
    import matplotlib

    from ..sim.results.files import close_png

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = plan.feasible()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if ok:
        ax.scatter([r.ttft_p99_s for r in ok], [r.usd_h for r in ok], color="tab:gray")
        front = plan.frontier()
        ax.plot([r.ttft_p99_s for r in front], [r.usd_h for r in front], "o-", color="tab:blue")
        for r in ok:
            ax.annotate(f"{r.shape.label} ×{r.replicas}", (r.ttft_p99_s, r.usd_h), fontsize=7)
    what = (
        f"within {plan.gpu_budget} GPUs"
        if plan.gpu_budget is not None
        else f"for {plan.target_rps:.1f} req/s"
    )
    title = f"deployments {what} (blue: Pareto frontier)"
    ax.set(xlabel="p99 TTFT at the operating point (s)", ylabel="$ per hour", title=title)
    fig.tight_layout()
    return close_png(fig, path)


def print_plan(con: Any, plan: Plan, title: str, base: Plan | None = None) -> None:
    from rich.table import Table

    if plan.gpu_budget is not None:
        head = f"{title}: the most within {plan.gpu_budget} GPUs"
    else:
        head = f"{title}: {plan.target_rps:.1f} req/s, {plan.storage_nodes} storage nodes"
    t = Table(title=head)
    columns = ("shape", "status", "bound", "sustains", "replicas", "serves", "$/h", "$/M out",
               "TTFT p99", "TPOT p99")  # fmt: skip
    for col in columns:
        t.add_column(col, justify="left" if col in ("shape", "status") else "right")
    order = {id(r): i for i, r in enumerate(plan.feasible())}
    for r in sorted(plan.results, key=lambda r: (order.get(id(r), len(order)), r.usd_h)):
        feasible = r.status == "feasible"
        t.add_row(
            r.shape.label,
            r.status,
            f"{r.bound_rps:.1f}",
            f"{r.sustainable_rps:.1f}" if r.status in ("feasible", "infeasible") else "-",
            str(r.replicas) if feasible else "-",
            f"{r.rate_rps:.1f}" if feasible else "-",
            f"{r.usd_h:,.0f}" if feasible else "-",
            f"{r.usd_per_mtok_output:.2f}" if feasible else "-",
            f"{r.ttft_p99_s * 1e3:,.0f} ms" if feasible else "-",
            f"{r.tpot_p99_s * 1e3:,.1f} ms" if feasible else "-",
        )
    con.print(t)
    print_front(con, plan)
    con.print(plan.why())
    best = plan.best
    if best is not None:
        con.print(
            f"recommended: {best.shape.label} × {best.replicas} = "
            f"{best.replicas * best.unit_gpus} GPUs + {best.storage_nodes} storage nodes, "
            f"${best.usd_h:,.0f}/h, ${best.usd_per_mtok_output:.2f}/M output tokens, "
            f"revenue ${best.revenue_per_gpu_hour_usd:.2f}/GPU-h"
        )
    if base is not None:
        d = delta(plan, base)
        if "usd_h" in d:
            con.print(
                f"delta vs base: {d['base']} → {d['what_if']}, {d['usd_h']:+,.0f} $/h "
                f"({d['usd_h_pct']:+.1f} %), {d['gpus']:+d} GPUs, "
                f"{d['storage_nodes']:+d} storage nodes"
            )


def print_front(con: Any, plan: Plan, rows: int = 12) -> None:
    """The front's Pareto points (at most ``rows``, spread over it) and the simulated ones."""
    from rich.table import Table

    best = sorted((p for p in plan.front if p.pareto), key=lambda p: p.tok_s_per_user)
    sims = [p for p in plan.front if p.simulated]
    if not best and not sims:
        return
    step = max(1, math.ceil(len(best) / rows))
    t = Table(title=f"front: {_front_title(plan)} (steady state; * simulated)")
    for col in ("deployment", "tok/s per user", "tok/s per GPU", "$/M out", "TTFT p99"):
        t.add_column(col, justify="left" if col == "deployment" else "right")
    for p in [*best[::step], *sims]:
        t.add_row(
            ("* " if p.simulated else "") + p.deployment,
            f"{p.tok_s_per_user:,.1f}",
            f"{p.tok_s_per_gpu:,.0f}",
            f"{p.usd_per_m_tokens:.2f}",
            f"{p.p99_ttft_s * 1e3:,.0f} ms" if p.simulated else "-",
        )
    con.print(t)
