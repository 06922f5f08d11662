"""Does a decode batch cost more when its sequences differ in length? A device diagnostic.

The calibration grid times decode with every sequence at one context length; a serving batch
mixes lengths. The engine-core replays ran 6–9 % slower per step than the fitted model at 2–64
sequences (``step_residuals.py``). This times the same shapes with the lengths spread evenly over
mean · (1 ± spread), same total KV: each layer kind alone (graphed, as the grid times it) and the
engine core's whole graphed decode step (as the replay runs it), and reports each time against
the uniform one.

``python -m deepinfer_sim.calibration.mixed_contexts --out FILE.json [--device cuda]``
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .torch_bench import TorchBench

LAYER_SHAPES = ((16, 4096), (64, 4096), (64, 8192))
ENGINE_SHAPES = ((4, 2048), (16, 4096), (64, 4096), (64, 8192))
SPREADS = (0.0, 0.5, 0.9)


def _relative(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Each row's time over the uniform (spread 0) row of the same ``keys``."""
    base = {tuple(r[k] for k in keys): r["seconds"] for r in rows if r["spread"] == 0.0}
    return [{**r, "vs_uniform": r["seconds"] / base[tuple(r[k] for k in keys)]} for r in rows]


def measure(
    bench: TorchBench,
    layer_shapes: Sequence[tuple[int, int]] = LAYER_SHAPES,
    engine_shapes: Sequence[tuple[int, int]] = ENGINE_SHAPES,
    spreads: Sequence[float] = SPREADS,
) -> dict[str, Any]:
    layers = [
        {
            "kind": kind,
            "batch": b,
            "context": ctx,
            "spread": s,
            "seconds": bench.decode(kind, b, ctx, 1, s),
        }
        for kind in bench.kinds
        for b, ctx in layer_shapes
        for s in spreads
    ]
    engine = [
        {"batch": b, "context": ctx, "spread": s, "seconds": seconds}
        for s in spreads
        for _, b, _, ctx, seconds in bench.engine_steps(
            engine_shapes, (), spread=s, with_loop_gaps=False
        )
    ]
    return {
        "model": bench.spec.name,
        "kernels": bench.kernels,
        "device": bench.device_name,
        "layers": _relative(layers, ("kind", "batch", "context")),
        "engine": _relative(engine, ("batch", "context")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="deepseek-v4.1-flash")
    ap.add_argument("--kernels", default="deepseek", choices=["deepseek", "reference"])
    a = ap.parse_args()
    bench = TorchBench(a.device, a.model, backend=a.kernels, repeats=7, max_context=16_384)
    bench.warmup()
    res = measure(bench)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    for part in ("layers", "engine"):
        for r in res[part]:
            label = r.get("kind", "engine")
            print(
                f"{label:7s} b={r['batch']:3d} ctx={r['context']:5d} spread={r['spread']:.1f} "
                f"{r['seconds'] * 1e6:9.1f} us  x{r['vs_uniform']:.3f}"
            )


if __name__ == "__main__":
    main()
