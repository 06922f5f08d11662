"""The golden check: what a refactor must not change.

Each case runs a scenario and keeps its summary (less the wall time) and a hash of every
per-request and time-series value. ``python tests/golden/cases.py --update`` rewrites
``golden.json`` — on purpose only, when a change of results is intended and stated in its commit.

The hashes are exact, and hold on any x86-64 machine: the simulator's arithmetic does not depend
on the CPU (deepinfer_sim.fpmath; tests/integration/test_portability.py runs ``mixed-small`` and
``azure-b200-2k`` with numpy's SIMD targets, glibc's FMA paths and OpenBLAS's kernels switched).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.sim.results.metrics import round_floats

GOLDEN = Path(__file__).with_name("golden.json")

CASES: dict[str, tuple[str, list[str]]] = {
    "default": ("default", []),
    "mixed": ("mixed", []),
    "default-2k-fixed-static": (
        "default",
        [
            "workload.max_requests=2000",
            "policies.speculative.policy=fixed",
            "policies.eplb.decode.policy=static",
        ],
    ),
    "azure-b200-2k": ("azure-conv-b200", ["workload.max_requests=2000"]),
    "mixed-small": ("mixed", ["workload.sessions.days=0.02"]),
}


def frame_hash(frame: pd.DataFrame) -> str:
    """sha256 over the column names and every value (file-format independent)."""
    h = hashlib.sha256(",".join(map(str, frame.columns)).encode())
    h.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return h.hexdigest()


def run_case(name: str) -> dict[str, Any]:
    ref, overrides = CASES[name]
    res = simulate(load_scenario(ref, overrides))
    summary = dict(res.summary)
    summary["sim"] = {k: v for k, v in summary["sim"].items() if k != "wall_s"}
    return {
        "summary": round_floats(summary),
        "requests_sha256": frame_hash(res.requests),
        "timeseries_sha256": frame_hash(res.timeseries),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="rewrite golden.json")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    a = ap.parse_args()
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    changed = []
    for name in a.cases:
        got = json.loads(json.dumps(run_case(name)))
        if got != golden.get(name):
            changed.append(name)
        golden[name] = got
    if a.update:
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print("changed: " + (", ".join(changed) or "none"))
    sys.exit(1 if changed and not a.update else 0)


if __name__ == "__main__":
    main()
