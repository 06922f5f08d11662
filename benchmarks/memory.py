"""Peak memory of a run at 10 k, 100 k and 1 M requests (a benchmark, not a test).

Each size runs the ``mixed`` scenario (synthetic chatbot and agent sessions plus multimodal
requests, ``traces/synth/sessions.py``) over enough days to reach it, in a fresh subprocess:
build the workload, ``simulate``, then write the run folder (parquet files and plots) to a
temporary directory. It reports the process's peak resident memory (``ru_maxrss``) after the
simulation and after the write, and the wall time of each, then writes them with the machine's
description to ``benchmarks/results/memory.json`` (a size not run keeps its row there; each row
has the date it was measured).

    python benchmarks/memory.py [--sizes 10k,100k,1M] [--set KEY=VALUE ...]

The 1 M run takes ~10 minutes on one core.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

from _cli_run import machine, write_report  # benchmarks/ is the script's folder

SCENARIO = "mixed"
DAYS = {"10k": 0.115, "100k": 0.95, "1M": 7.3}
"""Days of sessions that give about that many requests (sessions and images together)."""
OUT = Path(__file__).parent / "results" / "memory.json"


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def measure(overrides: list[str]) -> dict[str, Any]:
    """Run one scenario in this process; its size, peaks and wall times."""
    from deepinfer_sim import load_scenario, simulate

    start_mb = _peak_mb()  # the interpreter and the simulator's modules
    sc = load_scenario(SCENARIO, overrides)
    t0 = time.perf_counter()
    result = simulate(sc)
    t1 = time.perf_counter()
    sim_mb = _peak_mb()
    with tempfile.TemporaryDirectory() as out:
        result.write(out)
    t2 = time.perf_counter()
    return {
        "requests": int(result.summary["requests"]["arrived"]),
        "simulated_s": round(float(result.summary["sim"]["simulated_s"]), 1),
        "import_peak_mb": round(start_mb, 1),
        "simulate_peak_mb": round(sim_mb, 1),
        "peak_mb": round(_peak_mb(), 1),
        "simulate_wall_s": round(t1 - t0, 1),
        "write_wall_s": round(t2 - t1, 1),
    }


def run_size(size: str, extra: list[str]) -> dict[str, Any]:
    """One size in a fresh interpreter (so each peak is its own)."""
    overrides = [f"workload.sessions.days={DAYS[size]}", *extra]
    cmd = [sys.executable, __file__, "--child", json.dumps(overrides)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{size}: the run failed\n{done.stderr[-4000:]}")
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"size": size, "date": date.today().isoformat(), "overrides": overrides, **row}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10k,100k,1M", help=f"comma-separated, of {list(DAYS)}")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(measure(json.loads(args.child))))
        return
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in DAYS]
    if unknown:
        ap.error(f"unknown sizes {unknown}; known: {list(DAYS)}")
    runs = []
    for size in sizes:
        row = run_size(size, args.overrides)
        runs.append(row)
        print(
            f"{size}: {row['requests']:,} requests, peak {row['peak_mb']:,.0f} MB "
            f"({row['simulate_peak_mb']:,.0f} MB after simulate), "
            f"{row['simulate_wall_s']:.0f} s simulate + {row['write_wall_s']:.0f} s write",
            flush=True,
        )
    out = Path(args.out)
    kept = json.loads(out.read_text())["runs"] if out.exists() else []
    done = {row["size"] for row in runs}
    runs = [row for row in kept if row["size"] not in done] + runs  # other sizes stay
    runs.sort(key=lambda row: list(DAYS).index(row["size"]))
    report = {
        "scenario": SCENARIO,
        "date": date.today().isoformat(),
        "machine": machine(),
        "runs": runs,
    }
    write_report(out, report)


if __name__ == "__main__":
    main()
