"""Write the planner example's workload: Poisson arrivals, every request 4,000 tokens in and 500
out (issue 31's question), as an Azure-format CSV.

    python docs/examples/fixed_trace.py OUT.csv [--rate 47] [--requests 6000] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rate", type=float, default=47.0, help="requests per second")
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--input", type=int, default=4000)
    ap.add_argument("--output", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    t = np.cumsum(rng.exponential(1.0 / a.rate, a.requests))
    stamps = np.datetime64("2023-11-16T18:00:00") + (t * 1e6).astype("timedelta64[us]")
    rows = [f"{str(s).replace('T', ' ')},{a.input},{a.output}" for s in stamps]
    a.out.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
