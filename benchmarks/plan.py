"""The capacity planner over a 108-shape grid with 2 workers, end to end (a benchmark, not a
test).

``deepinfer-sim plan default --workers 2`` with ``planner.prefill_ep=[2,4,8,16]``,
``planner.prefill_instances=[2,4,6,8,12,16,20,24,32]`` and ``planner.decode_ep=[32,64,128]``:
108 candidate shapes, each simulated by load bisection unless its cost bound prunes it. Each
repeat is a fresh process (start-up and writing the plan included); reports wall seconds, min and
median over ``--repeats``, how many shapes were simulated and pruned, and the largest process's
peak RSS, and writes them with the machine's description to ``benchmarks/results/plan.json``.
The target (issue 17) is ≥ 100 shapes in ≤ 5 minutes with 2 workers.

    python benchmarks/plan.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from _cli_run import machine, write_report  # benchmarks/ is the script's folder

GRID = (
    "planner.prefill_ep=[2,4,8,16]",
    "planner.prefill_instances=[2,4,6,8,12,16,20,24,32]",
    "planner.decode_ep=[32,64,128]",
)
TARGET_WALL_S = 300.0


def one_run() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "deepinfer_sim.cli", "plan", "default", "--workers", "2"]
        cmd += ["--out", out]
        for kv in GRID:
            cmd += ["--set", kv]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    lines = proc.stdout.splitlines()
    return {
        "wall_s": wall,
        "shapes": sum(": pruned (bound" in ln or ", sustains " in ln for ln in lines),
        "pruned": sum(": pruned (bound" in ln for ln in lines),
        "largest_process_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "plan.json"))
    args = ap.parse_args()
    runs = []
    for i in range(args.repeats):
        r = one_run()
        runs.append(r)
        print(
            f"run {i + 1}: {r['wall_s']:.1f} s wall, {r['shapes']:.0f} shapes "
            f"({r['pruned']:.0f} pruned by their cost bound)",
            flush=True,
        )
    walls = [r["wall_s"] for r in runs]
    report = {
        "benchmark": "deepinfer-sim plan over 108 candidate shapes, 2 workers, end to end",
        "command": "deepinfer-sim plan default --workers 2 " + " ".join(f"--set {g}" for g in GRID),
        "date": date.today().isoformat(),
        "machine": machine(),
        "runs": runs,
        "min_wall_s": round(min(walls), 1),
        "median_wall_s": round(statistics.median(walls), 1),
        "target_wall_s": TARGET_WALL_S,
    }
    write_report(args.out, report)
    print(f"median {report['median_wall_s']} s (min {report['min_wall_s']} s); target ≤ 300 s")


if __name__ == "__main__":
    main()
