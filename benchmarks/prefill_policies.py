"""Prefill routing policies compared on the default scenario's mixed-length workload.

Runs the default scenario (Mooncake conversation trace: prompts from a few hundred tokens to
126K, so the <16K, 16K-64K and 64K-256K tiers all occur) once per router policy and reports
TTFT p50/p99 per length tier. Writes ``benchmarks/results/prefill_policies.{json,md}``.

    python benchmarks/prefill_policies.py [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from deepinfer_sim import load_scenario, simulate

POLICIES = ("tiered", "least_outstanding", "cache_affinity", "round_robin")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "prefill_policies"))
    args = ap.parse_args()
    rows = []
    for policy in POLICIES:
        sc = load_scenario("default", [*args.overrides, f"policies.prefill_router={policy}"])
        t0 = time.perf_counter()
        s = simulate(sc).summary
        row = {
            "policy": policy,
            "wall_s": round(time.perf_counter() - t0, 2),
            "ttft_p50_s": s["latency"]["ttft_s"]["p50"],
            "ttft_p99_s": s["latency"]["ttft_s"]["p99"],
            "swa_remote_hits": s["prefill"]["swa_remote_hits"],
            "swa_hits": s["prefill"]["swa_hits"],
            "by_tier": {
                tier: {
                    "requests": v["requests"],
                    "p50": v["ttft_s"]["p50"],
                    "p99": v["ttft_s"]["p99"],
                }
                for tier, v in s["prefill"]["by_tier"].items()
            },
        }
        rows.append(row)
        print(policy, json.dumps(row["by_tier"]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(
        json.dumps({"overrides": args.overrides, "runs": rows}, indent=2) + "\n"
    )
    tiers = list(rows[0]["by_tier"])
    lines = [
        "| policy | all p50 / p99 | " + " | ".join(f"{t} p50 / p99" for t in tiers) + " |",
        "|---" * (len(tiers) + 2) + "|",
    ]
    for r in rows:
        cells = [f"{r['ttft_p50_s'] * 1e3:,.0f} / {r['ttft_p99_s'] * 1e3:,.0f} ms"]
        for t in tiers:
            v = r["by_tier"].get(t)
            cells.append(f"{v['p50'] * 1e3:,.0f} / {v['p99'] * 1e3:,.0f} ms" if v else "-")
        lines.append(f"| {r['policy']} | " + " | ".join(cells) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
