"""How long one EPLB rebalance takes, and how much weight it moves.

For 384 experts × 40 MoE layers (DeepSeek-V4.1-Flash) at the article's widths — decode EP128 and
EP64 with 1 redundant expert per GPU, prefill EP4 with 4 — times ``rebalance`` (replicate +
balanced packing) and ``match_ranks`` (keep experts in place) on loads drawn from the default
expert-load model, then a second rebalance on the loads a few minutes of drift later to count the
experts that move. The budget is < 50 ms per rebalance at EP128 (issue 6). Median of ``--repeat``.
Numpy's references unless ``DEEPINFER_JIT=1`` (the compiled steps a run of 1,000 requests or more
takes; the report says which). Writes ``benchmarks/results/eplb_rebalance.json``.

    [DEEPINFER_JIT=1] python benchmarks/eplb_rebalance.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from deepinfer_sim import load_scenario
from deepinfer_sim.jit import COMPILED
from deepinfer_sim.models.registry import load_model
from deepinfer_sim.sim.policies.eplb import match_ranks, moved_experts, rebalance
from deepinfer_sim.sim.stages.expert_load import ExpertLoadModel

POINTS = (("decode", 128, 1), ("decode", 64, 1), ("prefill", 4, 4))
TOKENS = 1e6  # token-choices per layer in the window: enough that sampling noise is small


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--drift-s", type=float, default=300.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "eplb_rebalance.json"))
    args = ap.parse_args()
    sc = load_scenario("default")
    model = load_model(sc.model)
    load = ExpertLoadModel(sc.policies.eplb.load, model, ["all"], sc.seed)
    before = load.mean_popularity() * TOKENS
    load.advance(args.drift_s)
    after = load.mean_popularity() * TOKENS
    rows = []
    for pool, ep, red in POINTS:
        reb_s, old = timed(lambda ep=ep, red=red: rebalance(before, ep, red), args.repeat)
        new = rebalance(after, ep, red)
        match_s, kept = timed(
            lambda old=old, new=new: match_ranks(old, new, model.moe.routed_experts), args.repeat
        )
        slots = old.phy2log.size
        raw = int(moved_experts(old, new, model.moe.routed_experts).sum())
        matched = int(moved_experts(old, kept, model.moe.routed_experts).sum())
        rows.append({
            "pool": pool, "ep": ep, "redundant_per_gpu": red,
            "layers": model.moe_layer_count("decode"), "experts": model.moe.routed_experts,
            "rebalance_ms": reb_s * 1e3, "match_ranks_ms": match_s * 1e3,
            "total_ms": (reb_s + match_s) * 1e3,
            "slots": slots, "moved_unmatched": raw, "moved_matched": matched,
            "moved_fraction": matched / slots,
        })  # fmt: skip
        r = rows[-1]
        print(f"{pool:7s} EP{ep:<4d} red {red}: rebalance {r['rebalance_ms']:6.1f} ms + match "
              f"{r['match_ranks_ms']:6.1f} ms; after {args.drift_s:.0f} s of drift "
              f"{matched}/{slots} slots move ({raw} without matching)")  # fmt: skip
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, "
        f"Python {platform.python_version()}, numpy {np.__version__}",
        "compiled": bool(COMPILED),
        "repeat": args.repeat,
        "drift_s": args.drift_s,
        "points": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
