"""Decode balancers against a perfectly balanced offline run (SPEC.md §2.4).

A batch of requests (the first N of the Mooncake conversation trace: their prompt and output
lengths) is present at t = 0 on one EP64 GB200 decode group (default scenario), routed by each
balancer and decoded to completion; throughput = output tokens / makespan. The ideal is the
same batch costed as if every rank held the group-mean load at every step. The article reports
DeepSeek's full stack at about 80 % of that ideal. Writes
``benchmarks/results/decode_balancers.{json,md}``.

    python benchmarks/decode_balancers.py [--requests 8000] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from deepinfer_sim import load_scenario
from deepinfer_sim.planner.analysis.offline import offline_makespan
from deepinfer_sim.traces import read_trace

POLICIES = ("two_dim", "least_requests", "round_robin")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    src = read_trace("builtin:mooncake_conversation").head(args.requests)
    inputs = np.asarray(src.input_len)
    outputs = np.maximum(np.asarray(src.output_len), 2)
    runs = {}
    sc = load_scenario("default", args.overrides)
    ideal = offline_makespan(sc, inputs, outputs, ideal=True)
    runs["ideal"] = ideal
    for policy in POLICIES:
        sc = load_scenario("default", [*args.overrides, f"policies.decode_balancer={policy}"])
        runs[policy] = offline_makespan(sc, inputs, outputs)
    base = ideal.tokens_per_s_per_rank
    rows = {
        k: {
            "tokens_per_s_per_rank": r.tokens_per_s_per_rank,
            "fraction_of_ideal": r.tokens_per_s_per_rank / base,
            "makespan_s": r.makespan_s,
            "steps": r.steps,
            "mean_step_s": r.mean_step_s,
        }
        for k, r in runs.items()
    }
    out = Path(__file__).parent / "results" / "decode_balancers"
    out.with_suffix(".json").write_text(
        json.dumps({"requests": args.requests, "overrides": args.overrides, "runs": rows}, indent=2)
        + "\n"
    )
    md = [
        "| balancer | output tok/s per rank | of ideal | makespan | steps |",
        "|---|---|---|---|---|",
    ]
    for k, r in rows.items():
        md.append(
            f"| {k} | {r['tokens_per_s_per_rank']:,.0f} | {r['fraction_of_ideal']:.1%} | "
            f"{r['makespan_s']:,.1f} s | {r['steps']:,} |"
        )
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
