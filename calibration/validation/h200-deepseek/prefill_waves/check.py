"""The prefill attention's waves, checked where no fit has looked: V3's TP4 and TP8 slices
timed on both sides of each wave edge (the longest chunk a number of waves holds and one row
more), predicted before the device call by the shipped fit (waves) and by the fit without waves
or merge (the smooth and prefix forms, re-fitted from the same raw points). Run from the
repository root:

    python calibration/validation/h200-deepseek/prefill_waves/check.py predict
    python calibration/validation/h200-deepseek/prefill_waves/check.py compare MEASURED.json...

``predict`` writes ``predictions.json`` beside this file (the shapes the device stage ``waves``
times: ``calibration/device_run.sh``); ``compare`` reads ``prefill_sizes.py`` outputs and prints
measured / predicted per shape, each form's MAPE and the step at every edge.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from deepinfer_sim.calibration.fit import fit_prefill, prefill_model
from deepinfer_sim.models.profile import load_profile

HERE = Path(__file__).parent
MODELS = ("deepseek-v3@tp4", "deepseek-v3@tp8")
# the last chunk of whole 128-row tiles each wave holds (TP4: 4.125 tiles per wave, so 4, 8, 12,
# 16, 20 tiles; TP8: 8.25, so 8, 16, 24, 33) and one row more, and two chunks inside a wave
SIZES = (448, 512, 513, 768, 1024, 1025, 1536, 1537, 2048, 2049, 2560, 2561, 3072, 3073, 4224, 4225)
PREFIXES = (16384, 65536)


def predictions() -> dict[str, list[dict[str, float]]]:
    prof = load_profile("h200-deepseek")
    out: dict[str, list[dict[str, float]]] = {}
    X = np.array([(n, p) for p in PREFIXES for n in SIZES], dtype=float)
    for name in MODELS:
        fits = prof.models[name]
        shipped = fits.hardware["h200"].prefill["mla"]
        grid = np.array([r[1:] for r in fits.raw["prefill"]], dtype=float)
        plain, _ = fit_prefill(grid[:, :2], grid[:, 2], forms=("smooth", "prefix"))
        waves, smooth = prefill_model(shipped, X), prefill_model(plain, X)
        out[name] = [
            {"n": n, "p": p, "waves_s": float(w), "smooth_s": float(s)}
            for (n, p), w, s in zip(X, waves, smooth, strict=True)
        ]
    return out


def compare(paths: list[Path]) -> list[str]:
    predicted = json.loads((HERE / "predictions.json").read_text())
    lines = []
    for path in paths:
        res = json.loads(path.read_text())
        name = res["model"]
        timed = {(r["n"], r["p"]): r["seconds"] for r in res["timed"]}
        rows = [r for r in predicted[name] if (r["n"], r["p"]) in timed]
        lines.append(f"{name} on {res['device']}: measured / predicted")
        lines.append(f"{'n':>6} {'p':>6} {'measured us':>12} {'waves':>7} {'smooth':>7}")
        err: dict[str, list[float]] = {"waves": [], "smooth": []}
        for r in rows:
            t = timed[(r["n"], r["p"])]
            w, s = t / r["waves_s"], t / r["smooth_s"]
            err["waves"].append(abs(w - 1))
            err["smooth"].append(abs(s - 1))
            lines.append(f"{r['n']:6.0f} {r['p']:6.0f} {t * 1e6:12.1f} {w:7.3f} {s:7.3f}")
        lines.append(
            f"MAPE: waves {np.mean(err['waves']):.1%}, smooth {np.mean(err['smooth']):.1%} "
            f"({len(rows)} shapes)"
        )
        for p in PREFIXES:
            steps = []
            for n in SIZES:
                if (n + 1, p) in timed and (n, p) in timed:
                    steps.append(f"{n}->{n + 1}: {timed[(n + 1, p)] / timed[(n, p)]:.3f}")
            lines.append(f"  p={p}: one row past each size: " + ", ".join(steps))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("predict")
    cmp = sub.add_parser("compare")
    cmp.add_argument("measured", nargs="+", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "predict":
        (HERE / "predictions.json").write_text(json.dumps(predictions(), indent=1) + "\n")
        return 0
    print("\n".join(compare(a.measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
