"""Bounded vs exact SWA replay: total prefill compute on the default scenario.

Runs the default scenario with ``cache.swa.mode=bounded`` (replay the last 128 tokens through
the decoder layers) and ``exact`` (recompute the last 2,560), and reports total prefill FLOPs,
new and replayed tokens, and the ratio — then explains it from the distribution of new tokens
per request. Writes ``benchmarks/results/swa_replay.{json,md}``.

    python benchmarks/swa_replay.py [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.models.registry import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "swa_replay"))
    args = ap.parse_args()
    runs = {}
    new_tokens = None
    for mode in ("bounded", "exact"):
        res = simulate(load_scenario("default", [*args.overrides, f"cache.swa.mode={mode}"]))
        s = res.summary["prefill"]
        runs[mode] = {
            "flops": s["flops"],
            "replay_flops": s["replay_flops"],
            "compute_tokens": s["compute_tokens"],
            "replay_tokens": s["replay_tokens"],
            "ttft_p50_s": res.summary["latency"]["ttft_s"]["p50"],
            "ttft_p99_s": res.summary["latency"]["ttft_s"]["p99"],
            "prefill_utilization": res.summary["utilization"]["prefill"],
        }
        frame = res.requests
        new_tokens = (frame["input_tokens"] - frame["prefix_hit_tokens"]).to_numpy(float)
    model = load_model(load_scenario("default", args.overrides).model)
    enc = sum(model.linear_flops_per_token("prefill"))
    dec = sum(model.linear_flops_per_token("replay"))
    assert new_tokens is not None
    ratio = runs["exact"]["flops"] / runs["bounded"]["flops"]
    mean_new = float(new_tokens.mean())
    # per request: new·enc + replay·dec (attention ignored): the ratio this predicts
    predicted = (mean_new * enc + 2560 * dec) / (mean_new * enc + 128 * dec)
    # the new-tokens level at which exact costs twice bounded ("nearly halves")
    halving = (2560 - 2 * 128) * dec / enc
    report = {
        "overrides": args.overrides,
        "runs": runs,
        "exact_over_bounded_flops": ratio,
        "bounded_saves": 1 - 1 / ratio,
        "new_tokens_per_request": {
            "mean": mean_new,
            "p50": float(np.median(new_tokens)),
            "p90": float(np.percentile(new_tokens, 90)),
            "share_under_2560": float((new_tokens < 2560).mean()),
        },
        "linear_flops_per_token": {"encoder_layers": enc, "decoder_layers": dec},
        "predicted_ratio_from_mean_new_tokens": predicted,
        "new_tokens_at_which_exact_doubles_compute": halving,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    b, e = runs["bounded"], runs["exact"]
    md = [
        "| mode | prefill FLOPs | new tokens | replayed tokens | TTFT p50 / p99 | prefill busy |",
        "|---|---|---|---|---|---|",
    ]
    for mode, r in (("bounded (128)", b), ("exact (2,560)", e)):
        md.append(
            f"| {mode} | {r['flops']:.3e} | {r['compute_tokens']:,} | {r['replay_tokens']:,} | "
            f"{r['ttft_p50_s'] * 1e3:,.0f} / {r['ttft_p99_s'] * 1e3:,.0f} ms | "
            f"{r['prefill_utilization']:.1%} |"
        )
    md.append("")
    md.append(
        f"exact / bounded prefill FLOPs = {ratio:.3f} (bounded saves {1 - 1 / ratio:.1%}); "
        f"mean new tokens per request {mean_new:,.0f} (p50 {np.median(new_tokens):,.0f}); "
        f"a request computing N new tokens costs N·{enc / 1e9:.1f} + R·{dec / 1e9:.1f} GFLOP "
        f"(R replayed), so exact doubles the work when N ≈ {halving:,.0f}."
    )
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
