"""Does a change of results stay inside the run-to-run spread? (a benchmark, not a test)

A change that alters random streams or the order of floating-point operations moves every
number of a run a little. This runs a bundled scenario at several seeds and prints the headline
figures per seed — p50/p99 TTFT and TPOT, output throughput, the EPLB imbalance — with their
spread (max − min over the seeds). Run it before and after such a change (e.g. from a worktree of
the old commit) and compare: a move of the seed-0 figures smaller than the spread is noise.

    python benchmarks/seed_spread.py default --seeds 0 1 2 [--set KEY=VALUE ...] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from deepinfer_sim import load_scenario, simulate

FIGURES = {
    "ttft_p50_s": ("latency", "ttft_s", "p50"),
    "ttft_p99_s": ("latency", "ttft_s", "p99"),
    "tpot_p50_s": ("latency", "tpot_s", "p50"),
    "tpot_p99_s": ("latency", "tpot_s", "p99"),
    "output_tok_per_s": ("throughput", "output_tok_per_s"),
    "decode_imbalance_mean": ("eplb", "decode_imbalance_mean"),
    "prefill_imbalance_mean": ("eplb", "prefill_imbalance_mean"),
}


def figures(summary: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, path in FIGURES.items():
        node: Any = summary
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        out[name] = float(node) if isinstance(node, int | float) else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    per_seed = {}
    for seed in a.seeds:
        s = simulate(load_scenario(a.scenario, [*a.overrides, f"seed={seed}"])).summary
        per_seed[seed] = figures(s)
        print(seed, json.dumps(per_seed[seed]), flush=True)
    spread = {}
    for name in FIGURES:
        vals = [x for v in per_seed.values() if (x := v[name]) is not None]
        spread[name] = (max(vals) - min(vals)) if vals else None
    print("spread", json.dumps(spread))
    if a.json_out:
        report = {"scenario": a.scenario, "overrides": a.overrides, "seeds": per_seed}
        Path(a.json_out).write_text(json.dumps({**report, "spread": spread}, indent=2) + "\n")


if __name__ == "__main__":
    main()
