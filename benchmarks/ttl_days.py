"""What cutting chatbot KV retention from 7 to 3 days costs in hit rate and saves in storage.

SPEC.md §2.5: agent traffic keeps 3 days, chatbot 7; cutting chatbot to 3 days cost DeepSeek
0.5–1 % of cache hit rate. On the multi-day session workload (traces/synth/sessions.py, default mix,
14 days, seed 0) the one-pass sweep (planner/analysis/ttl_sweep.py) evaluates both TTL settings
and counts the steady state only: requests of days 7–14, whose full 7-day history is in the
trace. Storage is the peak resident logical KV over days 7–14 (V4.1-Flash blocks), and the nodes
that hold it below the GC watermark (20 × 30.73 TB nodes, 10+2). Then the drivers: the chatbot
return probability and the median return gap, each varied around the default.

Writes ``benchmarks/results/ttl_days.json``.

    python benchmarks/ttl_days.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from deepinfer_sim import load_scenario
from deepinfer_sim.planner.analysis.storage_sizing import block_bytes, nodes_for
from deepinfer_sim.planner.analysis.ttl_sweep import ALL, ttl_sweep
from deepinfer_sim.traces.synth.sessions import DEFAULT_CHATBOT, SessionWorkload, generate_sessions

DAY = 86400.0
DAYS = 14
WEEK = {"agent": 3 * DAY, "chatbot": 7 * DAY}
CUT = {"agent": 3 * DAY, "chatbot": 3 * DAY}
OUT = Path(__file__).parent / "results" / "ttl_days.json"


def compare(cfg: SessionWorkload, seed: int) -> dict[str, Any]:
    sc = load_scenario("default")
    src = generate_sessions(cfg, seed)
    bb = block_bytes(sc, src)
    out: dict[str, Any] = {"requests": len(src)}
    for label, ttl in (("chatbot_7d", WEEK), ("chatbot_3d", CUT)):
        frame = ttl_sweep(src, [0.0], class_ttl=ttl, block_bytes=bb, measure_from_s=7 * DAY).frame
        rows = frame[frame["policy"] == "class_ttl"].set_index("traffic_class")
        total = rows.loc[ALL].to_dict()
        peak = float(total["peak_resident_bytes"])
        out[label] = {
            "hit_rate": {str(k): float(v) for k, v in rows["hit_rate"].items()},
            "hit_tokens": int(total["hit_tokens"]),
            "input_tokens": int(total["input_tokens"]),
            "peak_storage_tb": peak / 1e12,
            "nodes": nodes_for(sc.pools.storage, peak),
        }
    week, cut = out["chatbot_7d"], out["chatbot_3d"]
    out["cost"] = {
        "chatbot_hit_points": 100 * (week["hit_rate"]["chatbot"] - cut["hit_rate"]["chatbot"]),
        "all_hit_points": 100 * (week["hit_rate"][ALL] - cut["hit_rate"][ALL]),
        "chatbot_hit_relative": 1 - cut["hit_rate"]["chatbot"] / week["hit_rate"]["chatbot"],
        "recomputed_tokens_per_day": (week["hit_tokens"] - cut["hit_tokens"]) / (DAYS - 7),
        "storage_saved_fraction": 1 - cut["peak_storage_tb"] / week["peak_storage_tb"],
        "storage_saved_tb": week["peak_storage_tb"] - cut["peak_storage_tb"],
    }
    return out


def main() -> None:
    t0 = time.perf_counter()
    base = SessionWorkload(days=DAYS)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "workload": base.model_dump()}
    result["default"] = compare(base, 0)
    c = result["default"]["cost"]
    print(f"default: chatbot hit −{c['chatbot_hit_points']:.2f} pt, all −{c['all_hit_points']:.2f}"
          f" pt, storage −{100 * c['storage_saved_fraction']:.1f} %")  # fmt: skip
    drivers: dict[str, Any] = {}
    for prob in (0.5, 0.65, 0.8):
        chat = DEFAULT_CHATBOT.model_copy(update={"return_prob": prob})
        drivers[f"return_prob={prob}"] = compare(base.model_copy(update={"chatbot": chat}), 0)
    for hours in (2.0, 6.0, 18.0):
        gap = DEFAULT_CHATBOT.return_gap_s.model_copy(update={"median": hours * 3600})
        chat = DEFAULT_CHATBOT.model_copy(update={"return_gap_s": gap})
        drivers[f"return_gap_median_h={hours:g}"] = compare(
            base.model_copy(update={"chatbot": chat}), 0
        )
    for name, r in drivers.items():
        c = r["cost"]
        print(f"{name}: chatbot −{c['chatbot_hit_points']:.2f} pt, "
              f"all −{c['all_hit_points']:.2f} pt, "
              f"storage −{100 * c['storage_saved_fraction']:.1f} %")  # fmt: skip
    result["drivers"] = drivers
    result["wall_s"] = time.perf_counter() - t0
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT} in {result['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
