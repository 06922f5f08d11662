"""Synthetic session workloads (traces/synth/sessions.py) measured against the shared traces.

Prints the numbers quoted in ``docs/workloads.md``:

1. chatbot-only generator vs the Mooncake conversation trace, both seen through 1-hour windows
   (the trace is one hour): input/output length mean, p50, p90, and token-weighted prefix hit
   rate with an infinite cache that starts cold at the window start;
2. agent-only generator vs the TraceLab example sessions (Claude Code / Codex rounds);
3. default multi-day workloads (3 and 7 days): requests, hit rate per class with an infinite
   cache, and with the storage TTLs (agent 3 d; chatbot 7 d vs 3 d);
4. the TTL cost in steady state (days 7..14 of a 14-day workload);
5. generation speed (requests per second, best of three).

    python benchmarks/sessions_stats.py [--seed 0] [--tracelab PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from deepinfer_sim.planner.analysis.ttl_sweep import ALL, ttl_sweep
from deepinfer_sim.traces import RequestSource, read_trace
from deepinfer_sim.traces.synth.sessions import SessionWorkload, generate_sessions

DAY = 86400.0
TRACELAB = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "tracelab_example"
WINDOW_HOURS = (3.5, 9.5, 14.5, 20.5)
"""Start hours of the 1-hour windows cut from days 2..4 of a generated workload."""


def lengths(values: np.ndarray) -> dict[str, float]:
    p50, p90 = np.percentile(values, [50, 90])
    return {"mean": float(values.mean()), "p50": float(p50), "p90": float(p90)}


def window_stats(parts: list[RequestSource]) -> dict[str, Any]:
    """Lengths and hit rate pooled over windows, each window's cache starting cold."""
    inputs = np.concatenate([w.input_len for w in parts])
    outputs = np.concatenate([w.output_len for w in parts])
    hits = sum(int(w.prefix_hit_tokens().sum()) for w in parts)
    return {
        "requests": len(inputs),
        "input": lengths(inputs),
        "output": lengths(outputs),
        "hit_rate": hits / int(inputs.sum()),
    }


def chain_structure(parts: list[RequestSource]) -> dict[str, Any]:
    """How requests extend earlier ones, the statistics the chatbot defaults were fitted to.

    A request is a *follow-up* when its longest cached prefix goes past the blocks shared by
    more than 1 % of the requests (system prompts); its *parent* is the last earlier request
    that held the deepest hit block. Pooled over windows, each window on its own.
    """
    gaps: list[float] = []
    kept: list[float] = []
    follow = full = total = 0
    for src in parts:
        ids, counts = np.unique(src.block_hashes, return_counts=True)
        common = set(ids[counts > 0.01 * len(src)].tolist())
        holder: dict[int, int] = {}
        for i in range(len(src)):
            blocks = src.blocks(i).tolist()
            k = 0
            while k < len(blocks) and blocks[k] in holder:
                k += 1
            if k and blocks[k - 1] not in common:
                parent = holder[blocks[k - 1]]
                follow += 1
                gaps.append(float(src.arrival_s[i] - src.arrival_s[parent]))
                parent_full = int(src.input_len[parent]) // src.block_tokens
                if k >= parent_full:
                    full += 1
                else:
                    kept.append(k / parent_full)
            for h in blocks:
                holder[h] = i
        total += len(src)
    gap_p = np.percentile(gaps, [10, 50, 90])
    return {
        "follow_up_share": follow / total,
        "follow_up_gap_s_p10_p50_p90": gap_p.tolist(),
        "follow_ups_reusing_all_parent_full_blocks": full / follow,
        "partial_reuse_kept_share_p25_p50_p75": np.percentile(kept, [25, 50, 75]).tolist(),
    }


def mooncake_vs_chatbot(seed: int) -> dict[str, Any]:
    trace = read_trace("builtin:mooncake_conversation")
    src = generate_sessions(SessionWorkload(days=5, agent_fraction=0.0), seed)
    windows = [
        src.window(d * DAY + h * 3600, d * DAY + (h + 1) * 3600)
        for d in (2, 3, 4)
        for h in WINDOW_HOURS
    ]
    return {
        "mooncake": window_stats([trace]) | chain_structure([trace]),
        "generator_1h": window_stats(windows) | chain_structure(windows),
    }


def tracelab_rounds(folder: Path) -> dict[str, Any] | None:
    path = folder / "round_trace.jsonl"
    if not path.exists():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    inp = np.array([r["input_tokens_total"] for r in rows], dtype=float)
    out = np.array([r["output_tokens"] for r in rows], dtype=float)
    cached = np.array([r["prefix_tokens"] for r in rows], dtype=float)
    gaps = []
    by_session: dict[str, list[float]] = {}
    for r in rows:
        start = min(e["timestamp"] for e in r["timing_events"])
        t = datetime.fromisoformat(start.replace("Z", "+00:00")).timestamp()
        by_session.setdefault(r["session_id"], []).append(t)
    for times in by_session.values():
        gaps.extend(np.diff(sorted(times)).tolist())
    return {
        "rounds": len(rows),
        "sessions": len(by_session),
        "input": lengths(inp),
        "output": lengths(out),
        "hit_rate": float(cached.sum() / inp.sum()),
        "step_gap_s_p50": float(np.median(gaps)),
    }


def agent_generator(seed: int) -> dict[str, Any]:
    src = generate_sessions(SessionWorkload(days=3, agent_fraction=1.0), seed)
    order = np.lexsort((src.arrival_s, src.session_id))
    same = src.session_id[order][1:] == src.session_id[order][:-1]
    gaps = np.diff(src.arrival_s[order])[same]
    _, per_session = np.unique(src.session_id, return_counts=True)
    return {
        "requests": len(src),
        "input": lengths(src.input_len),
        "input_p99": float(np.percentile(src.input_len, 99)),
        "input_max": int(src.input_len.max()),
        "output": lengths(src.output_len),
        "hit_rate": float(src.prefix_hit_tokens().sum() / src.input_len.sum()),
        "step_gap_s_p50": float(np.median(gaps)),
        "requests_per_session_mean": float(per_session.mean()),
    }


def hit_rates(
    src: RequestSource, class_ttl: dict[str, float] | None = None, measure_from_s: float = 0.0
) -> dict[str, float]:
    """Token-weighted hit rate per class and overall (planner/analysis/ttl_sweep.py, refresh
    on read)."""
    ttl = class_ttl or {name: math.inf for name in src.class_names}
    frame = ttl_sweep(src, [math.inf], class_ttl=ttl, measure_from_s=measure_from_s).frame
    rows = frame[frame["policy"] == "class_ttl"].set_index("traffic_class")
    return {
        ("all" if name == ALL else name): float(rows.loc[name, "hit_rate"]) for name in rows.index
    }


def multi_day(days: float, seed: int) -> dict[str, Any]:
    src = generate_sessions(SessionWorkload(days=days), seed)
    out: dict[str, Any] = {"days": days, "requests": len(src)}
    for code, name in enumerate(src.class_names):
        mask = src.traffic_class == code
        out[f"{name}_requests"] = int(mask.sum())
        out[f"{name}_input_token_share"] = float(src.input_len[mask].sum() / src.input_len.sum())
    out["hit_infinite"] = hit_rates(src)
    out["hit_ttl_agent3d_chatbot7d"] = hit_rates(src, {"agent": 3 * DAY, "chatbot": 7 * DAY})
    out["hit_ttl_agent3d_chatbot3d"] = hit_rates(src, {"agent": 3 * DAY, "chatbot": 3 * DAY})
    return out


def steady_state_ttl(seed: int) -> dict[str, Any]:
    """TTL cost where every request has a full 7-day history: days 7..14 of a 14-day run.

    A 14-day default-mix workload at 8,000 sessions/day (hit rates barely depend on the rate;
    the smaller rate keeps memory low). Hit rates count the requests of days 7..14 only.
    """
    src = generate_sessions(SessionWorkload(days=14, sessions_per_day=8000), seed)
    out: dict[str, Any] = {"requests_counted": int((src.arrival_s >= 7 * DAY).sum())}
    for label, ttl in (
        ("infinite", None),
        ("agent3d_chatbot7d", {"agent": 3 * DAY, "chatbot": 7 * DAY}),
        ("agent3d_chatbot3d", {"agent": 3 * DAY, "chatbot": 3 * DAY}),
    ):
        out[label] = hit_rates(src, ttl, measure_from_s=7 * DAY)
    return out


def speed(seed: int) -> dict[str, Any]:
    cfg = SessionWorkload(days=7)
    best = np.inf
    n = 0
    for _ in range(3):
        t0 = time.perf_counter()
        n = len(generate_sessions(cfg, seed))
        best = min(best, time.perf_counter() - t0)
    return {"requests": n, "seconds": best, "requests_per_s": n / best}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tracelab", type=Path, default=TRACELAB)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    results = {
        "chatbot_vs_mooncake": mooncake_vs_chatbot(args.seed),
        "agent_vs_tracelab": {
            "tracelab": tracelab_rounds(args.tracelab),
            "generator": agent_generator(args.seed),
        },
        "multi_day": [multi_day(3, args.seed), multi_day(7, args.seed)],
        "steady_state_ttl": steady_state_ttl(args.seed),
        "speed": speed(args.seed),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
