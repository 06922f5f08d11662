"""How well conditioned the engine-core check is: the replay errors when every step costs a
little more or less.

A replay's TTFT and TPOT errors mix the step model's error with queueing: at load 0.5 a burst of
arrivals queues, and which prompts share a step depends on sub-millisecond timing. This module
re-simulates stored replays (``replay.recheck``) with every simulated step cost scaled by factors
near 1 (0.98 … 1.02). Where a 0.5 % change in every step moves the per-request p90 error by
several points, the check cannot resolve the step model to that precision, whatever the model.

``python -m deepinfer_sim.calibration.conditioning FOLDER [--profile P] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import UserError
from ..models.profile import Profile, load_profile
from .replay import recheck

SCALES = (0.98, 0.99, 0.995, 1.0, 1.005, 1.01, 1.02)


def conditioning(
    profile: Profile, folder: Path, report: dict[str, Any], scales: tuple[float, ...] = SCALES
) -> list[dict[str, Any]]:
    """One row per (trace, phase, scale, repeat): the p50 error and per-request p90 error."""
    rows = []
    for scale in scales:
        got = recheck(profile, folder, report, step_scale=scale)
        for trace, phases in got.items():
            for phase, res in phases.items():
                for k, run in enumerate(res["runs"]):
                    rows.append(
                        {
                            "trace": trace,
                            "phase": phase,
                            "scale": scale,
                            "repeat": k,
                            "p50_rel_err": run["p50_rel_err"],
                            "abs_rel_err_p90": run["abs_rel_err_p90"],
                        }
                    )
    return rows


def spread(rows: list[dict[str, Any]], lo: float = 0.995, hi: float = 1.005) -> pd.DataFrame:
    """Per trace and phase: the largest move of the p50 and p90 errors of any repeat between
    step scales ``lo`` and ``hi`` (both included), in points."""
    df = pd.DataFrame(rows)
    df = df[(df["scale"] >= lo - 1e-12) & (df["scale"] <= hi + 1e-12)]
    g = df.groupby(["trace", "phase", "repeat"])
    moved = pd.DataFrame(
        {
            "p50_moves": g["p50_rel_err"].agg(lambda s: s.max() - s.min()),
            "p90_moves": g["abs_rel_err_p90"].agg(lambda s: s.max() - s.min()),
        }
    )
    return moved.groupby(level=["trace", "phase"]).max() * 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--profile", default=None, help="default: the report's own")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    report_path = a.folder / "replay_report.json"
    if not report_path.is_file():
        ap.error(f"{a.folder}: no replay_report.json (a replay.py output folder?)")
    report = json.loads(report_path.read_text())
    try:
        profile = load_profile(a.profile or report["profile"])
    except UserError as exc:
        ap.error(str(exc))
    rows = conditioning(profile, a.folder, report)
    table = pd.DataFrame(rows)
    table["cell"] = [
        f"{p50 * 100:+.1f} / {p90 * 100:.1f}"
        for p50, p90 in zip(table["p50_rel_err"], table["abs_rel_err_p90"], strict=True)
    ]
    wide = table.pivot_table(
        index=["trace", "phase", "repeat"], columns="scale", values="cell", aggfunc="first"
    )
    print("p50 error / per-request p90 error (%) with every step cost × scale")
    print(wide.to_string())
    print("\nlargest move between × 0.995 and × 1.005 (points)")
    print(spread(rows).round(1).to_string())
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
