"""One simulated hour of the default deployment near saturation, end to end (a benchmark, not a
test).

``deepinfer-sim run default --set workload.repeat=25`` replays the default scenario's Mooncake
conversation trace 25 times back to back (~300,000 requests over ~3,600 simulated seconds; the
prefill pool runs ~80 % busy) with every mechanism on (live EPLB, the 3FS store, prefix cache,
SWA, DSpark), as a user runs it: a fresh process per run, start-up, simulation and writing every
output (plots too, unless ``--no-plots``) included. Reports wall seconds, requests per wall
second and the child's peak RSS, min and median over ``--repeats`` runs, and writes them with the
machine's description to ``benchmarks/results/hour.json``. The target (issue 32) is ≤ 40 s wall
on one core, i.e. ≤ 120 µs per request.

    python benchmarks/hour.py [--repeats 3] [--repeat 25] [--set KEY=VALUE ...] [--no-plots]
"""

from __future__ import annotations

import argparse
import statistics
from datetime import date
from pathlib import Path
from typing import Any

from _cli_run import machine, run_default, write_report  # benchmarks/ is the script's folder

TARGET_WALL_S = 40.0


def one_run(repeat: int, overrides: list[str], plots: bool) -> dict[str, Any]:
    """Run the CLI once in a child process; wall seconds, its peak RSS and what it simulated."""
    return run_default([f"workload.repeat={repeat}", *overrides], plots)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=25, help="workload.repeat (25: one hour)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hour.json"))
    args = ap.parse_args()
    runs = []
    for i in range(args.repeats):
        r = one_run(args.repeat, args.overrides, not args.no_plots)
        runs.append(r)
        print(
            f"run {i + 1}: {r['wall_s']:.1f} s wall ({r['sim_wall_s']:.1f} s simulating), "
            f"{r['simulated_s']:.0f} s simulated, {r['requests']:,} requests, "
            f"{r['events']:,} events, peak RSS {r['peak_rss_mib']:.0f} MiB",
            flush=True,
        )
    walls = [r["wall_s"] for r in runs]
    rss = [r["peak_rss_mib"] for r in runs if r["peak_rss_mib"] == r["peak_rss_mib"]]
    median = statistics.median(walls)
    report = {
        "benchmark": "one simulated hour of the default deployment, end to end",
        "command": f"deepinfer-sim run default --set workload.repeat={args.repeat}"
        + "".join(f" --set {kv}" for kv in args.overrides)
        + (" --no-plots" if args.no_plots else ""),
        "date": date.today().isoformat(),
        "machine": machine(),
        "runs": runs,
        "min_wall_s": round(min(walls), 2),
        "median_wall_s": round(median, 2),
        "requests": runs[0]["requests"],
        "simulated_s": round(runs[0]["simulated_s"], 1),
        "requests_per_wall_s": round(runs[0]["requests"] / median),
        "peak_rss_mib": round(max(rss)) if rss else None,
        "target_wall_s": TARGET_WALL_S,
    }
    write_report(args.out, report)
    print(
        f"median {median:.1f} s (min {min(walls):.1f} s) for {report['requests']:,} requests: "
        f"{report['requests_per_wall_s']:,} requests per wall second; target ≤ {TARGET_WALL_S:g} s"
    )


if __name__ == "__main__":
    main()
