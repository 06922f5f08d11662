"""Decode throughput per rank vs concurrency for each verify policy (SPEC.md §2.7).

EP64 decode group on GB200 (default scenario), sequences at 16,384 tokens of context, 1 to 200
sequences per rank; policies none, mtp1, fixed-5 and dspark (lag 2), with the default acceptance
parameters. Run on the calibrated ``sm100-derived`` profile and on the roofline. Writes
``benchmarks/results/dspark_sweep.{json,png}``.

    python benchmarks/dspark_sweep.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from deepinfer_sim import load_scenario
from deepinfer_sim.planner.analysis.offline import steady_throughput

POLICIES = ("none", "mtp1", "fixed", "dspark")
CONCURRENCY = (1, 2, 4, 8, 16, 24, 32, 48, 60, 80, 100, 128, 160, 200)
COSTS = ("sm100-derived", "roofline")


def main() -> None:
    out = Path(__file__).parent / "results" / "dspark_sweep"
    data: dict[str, dict[str, list[dict[str, float]]]] = {}
    for cost in COSTS:
        data[cost] = {}
        for policy in POLICIES:
            rows = []
            for c in CONCURRENCY:
                sc = load_scenario(
                    "default",
                    [f"cost_model.decode={cost}", f"policies.speculative.policy={policy}"],
                )
                r = steady_throughput(sc, c, context=16384, steps=150, warmup=20)
                rows.append(
                    {
                        "per_rank": c,
                        "tokens_per_s_per_rank": r.tokens_per_s_per_rank,
                        "verify": r.verify_tokens_per_seq_step,
                        "accept": r.accepted_tokens_per_seq_step,
                        "step_ms": r.mean_step_s * 1e3,
                    }
                )
            data[cost][policy] = rows
            print(cost, policy, [round(r["tokens_per_s_per_rank"]) for r in rows], flush=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, cost in zip(axes, COSTS, strict=True):
        for policy in POLICIES:
            rows = data[cost][policy]
            ax.plot(
                [r["per_rank"] for r in rows],
                [r["tokens_per_s_per_rank"] for r in rows],
                marker="o",
                ms=3,
                label=policy,
            )
        ax.set_xscale("log")
        ax.set_xlabel("concurrent sequences per rank")
        ax.set_ylabel("output tokens/s per rank")
        ax.set_title(f"EP64 GB200 decode, {cost}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)


if __name__ == "__main__":
    main()
