"""How wall time and memory grow with the cluster (a benchmark, not a test; the workload axis,
10k / 100k / 1M requests, is ``benchmarks/memory.py``).

Each point is a fresh ``deepinfer-sim run default --no-plots`` process (start-up and output
writing included), timed with its peak RSS: the default deployment × f (f × 16 prefill
instances, f decode groups of EP64: 128, 512, 2,048 GPUs) offered f × the default rate for the
same 153 simulated seconds (``workload.rate_scale`` and ``workload.repeat`` × f: the Mooncake
conversation trace, 12,031 requests a copy), so every GPU sees the same load and the requests
grow with the cluster. The cost per request should stay flat: ``us_per_request`` is the
simulation's own wall time per request (what the README's table compares), ``wall_us_per_request``
the whole process's, whose start-up and output writing (~0.7 s, numba's load among them) weigh
most at the smallest point. Writes ``benchmarks/results/scale.json`` and prints a table.

    python benchmarks/scale.py [--gpus 1,4,16]
"""

from __future__ import annotations

import argparse
from datetime import date
from pathlib import Path

from _cli_run import machine, run_default, write_report  # benchmarks/ is the script's folder

DEFAULT_RATE_SCALE = 25  # configs/default.yaml's workload.rate_scale
DEFAULT_GPUS = 128


def run_point(overrides: list[str]) -> dict[str, float]:
    """One CLI run of the default scenario with ``overrides`` in a child process."""
    r = run_default(overrides)
    peak = r["peak_rss_mib"]
    return {
        "wall_s": round(r["wall_s"], 2),
        "sim_wall_s": round(r["sim_wall_s"], 2),
        "peak_rss_mib": round(peak) if peak == peak else peak,  # NaN: below an earlier peak
        "requests": r["requests"],
        "simulated_s": round(r["simulated_s"], 1),
        "events": r["events"],
        "us_per_request": round(r["sim_wall_s"] / r["requests"] * 1e6, 1),
        "wall_us_per_request": round(r["wall_s"] / r["requests"] * 1e6, 1),
    }


def gpus_axis(factors: list[int]) -> list[dict[str, float]]:
    rows: list[dict[str, float]] = []
    for f in factors:
        point = run_point(
            [
                f"pools.prefill.instances={16 * f}",
                f"pools.decode.groups={f}",
                f"workload.rate_scale={DEFAULT_RATE_SCALE * f}",
                f"workload.repeat={f}",
            ]
        )
        rows.append({"gpus": DEFAULT_GPUS * f, "repeat": f, **point})
        print(rows[-1], flush=True)
    return rows


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=ints, default=[1, 4, 16], help="cluster multiples of 128")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "scale.json"))
    args = ap.parse_args()
    rows = gpus_axis(args.gpus)
    report = {
        "date": date.today().isoformat(),
        "machine": machine(),
        "rows": rows,
    }
    write_report(args.out, report)
    head = f"{'GPUs':>6}{'requests':>11}{'wall s':>9}{'sim s':>8}{'µs/req (sim)':>14}"
    print(f"{head}{'µs/req (wall)':>15}{'RSS MiB':>9}")
    for r in rows:
        print(
            f"{r['gpus']:>6}{r['requests']:>11,}{r['wall_s']:>9}{r['sim_wall_s']:>8}"
            f"{r['us_per_request']:>14}{r['wall_us_per_request']:>15}{r['peak_rss_mib']:>9}"
        )


if __name__ == "__main__":
    main()
