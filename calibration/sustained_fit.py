"""A hardware file's ``sustained_clock`` (models/power_limit.py) fitted to one GPU's
``calibration/sustained.py`` measurements of a prefill layer.

Each measurement is one busy pattern — back to back (``--duty 1``), or a busy share D with an
idle gap after every K calls (``--duty D --group K``) — and the ratio of the layer's time in it
to the calibration's timing of the same call in the same run. The fit:

* ``slowdown``: the median ratio of the back-to-back runs (the clock after seconds of compute);
* ``onset_share`` and ``window_s``: a grid search for the pair whose model, run through each
  pattern call by call (:class:`~deepinfer_sim.models.power_limit.BusyShare`, as the
  simulator runs it), comes closest to the measured ratios (least squares). The model never
  runs a step faster than the calibration timed it, so a measured ratio below 1 (a GPU at full
  clock, idle often enough to keep it) is compared as 1; the residuals are reported unclamped.

    python -m deepinfer_sim.calibration.sustained_fit FILE.json... [--workload layer:8192]
        [--source TEXT] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from ..models.power_limit import BusyShare, SustainedClock

PATTERN_S = 4.0  # seconds of each pattern the model runs (its steady state within ~5 windows)
ONSETS = np.round(np.arange(0.50, 0.991, 0.01), 2)
WINDOWS = np.round(np.geomspace(0.01, 0.8, 20), 4)


@dataclass(frozen=True)
class Pattern:
    """One measured busy pattern: the share, calls per burst, seconds per call, measured ratio."""

    duty: float
    group: int
    call_s: float
    ratio: float
    file: str


def load_patterns(paths: list[Path], workload: str) -> list[Pattern]:
    """The ``workload`` entry of each sustained.py JSON file, or a UserError naming the file."""
    out = []
    for path in paths:
        try:
            res = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: not a sustained.py result ({exc})") from None
        rows = [w for w in res.get("workloads", []) if w.get("workload") == workload]
        if not rows:
            raise UserError(f"{path}: no {workload!r} workload")
        w = rows[0]
        out.append(
            Pattern(
                float(res.get("duty", 1.0)),
                int(res.get("group", 1)),
                float(w["sustained_s"]),
                float(w["sustained_s"]) / float(w["burst_s"]),
                str(path),
            )
        )
    if not any(p.duty >= 1.0 for p in out):
        raise UserError("no back-to-back run (--duty 1) among the files: nothing sets slowdown")
    return out


def predicted_ratio(clock: SustainedClock, p: Pattern) -> float:
    """The model's mean slowdown over the last third of ``p``'s calls, run call by call."""
    busy = BusyShare(clock)
    gap = p.group * p.call_s * (1.0 / p.duty - 1.0)
    now, factors = 0.0, []
    while now < PATTERN_S:
        for _ in range(p.group):
            f = busy.factor(now)
            factors.append(f)
            now += p.call_s * f
            busy.ended(now, p.call_s * f)
        now += gap
    return float(np.mean(factors[len(factors) - max(1, len(factors) // 3) :]))


def fit(patterns: list[Pattern], source: str) -> dict[str, Any]:
    """The fitted ``sustained_clock`` and each pattern's measured and fitted ratio."""
    slowdown = float(np.median([p.ratio for p in patterns if p.duty >= 1.0]))
    slowdown = min(2.0, max(1.0, slowdown))
    best: tuple[float, float, float] | None = None
    for onset in ONSETS:
        for window in WINDOWS:
            clock = SustainedClock(
                slowdown=slowdown, window_s=float(window), onset_share=float(onset), source=source
            )
            err = sum((predicted_ratio(clock, p) - max(1.0, p.ratio)) ** 2 for p in patterns)
            if best is None or err < best[0]:
                best = (err, float(onset), float(window))
    assert best is not None
    clock = SustainedClock(slowdown=slowdown, window_s=best[2], onset_share=best[1], source=source)
    rows = [
        {
            "file": p.file,
            "duty": p.duty,
            "group": p.group,
            "call_ms": p.call_s * 1e3,
            "measured": p.ratio,
            "model": predicted_ratio(clock, p),
        }
        for p in patterns
    ]
    return {"sustained_clock": clock.model_dump(), "patterns": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sustained_fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--workload", default="layer:8192")
    ap.add_argument("--source", default="calibration/sustained.py")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        res = fit(load_patterns(args.files, args.workload), args.source)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    c = res["sustained_clock"]
    print(
        f"slowdown {c['slowdown']:.3f}, onset_share {c['onset_share']:.2f}, "
        f"window_s {c['window_s']:.3f}"
    )
    for r in res["patterns"]:
        print(
            f"  duty {r['duty']:.2f} x{r['group']:<3d} {r['call_ms']:7.2f} ms: measured "
            f"{r['measured']:.3f}, model {r['model']:.3f}  ({Path(r['file']).name})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
