"""Speed of the simulator on the default scenario (a benchmark, not a test).

Runs the bundled default scenario a few times in this process and prints wall time, simulated
seconds per wall second and simulated requests per wall second (median over the repeats), then
writes them with the machine's description to ``benchmarks/results/default.json``.

    python benchmarks/bench_default.py [--repeats 3] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import date
from pathlib import Path

from _cli_run import machine, write_report  # benchmarks/ is the script's folder

from deepinfer_sim import load_scenario, simulate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "default.json"))
    args = ap.parse_args()
    sc = load_scenario("default", args.overrides)
    runs = []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        result = simulate(sc)
        wall = time.perf_counter() - t0
        s = result.summary
        runs.append(
            {
                "wall_s": wall,
                "simulated_s": s["sim"]["simulated_s"],
                "requests": s["requests"]["arrived"],
                "events": s["sim"]["events"],
            }
        )
        print(
            f"run {i + 1}: {wall:.2f} s wall, {s['sim']['simulated_s']:.0f} s simulated, "
            f"{s['requests']['arrived']:,} requests, {s['sim']['events']:,} events"
        )
    wall = statistics.median(r["wall_s"] for r in runs)
    sim_s, reqs, events = runs[0]["simulated_s"], runs[0]["requests"], runs[0]["events"]
    report = {
        "scenario": "default",
        "overrides": args.overrides,
        "date": date.today().isoformat(),
        "machine": machine(),
        "median_wall_s": round(wall, 3),
        "simulated_s": round(sim_s, 1),
        "requests": reqs,
        "events": events,
        "sim_s_per_wall_s": round(sim_s / wall, 1),
        "requests_per_wall_s": round(reqs / wall),
        "events_per_wall_s": round(events / wall),
        "runs": runs,
    }
    write_report(args.out, report)
    print(
        f"median {wall:.2f} s wall: {report['sim_s_per_wall_s']} simulated s/s, "
        f"{report['requests_per_wall_s']:,} requests/s, {report['events_per_wall_s']:,} events/s"
    )


if __name__ == "__main__":
    main()
