"""How much of a graphed layer's calibration time is the graph's launch, not its kernels.

The calibration times a call of at most ``GRAPH_WORTH_S`` as a CUDA graph: one replay between
two events after the device is synchronized (``TorchBench.timed_call``). The first event fires
on an idle GPU at once, so the time also holds the host's launch of the graph until its first
kernel starts. An engine replays a whole step's layers in one graph (or launches the next while
one runs): it pays that once per step, not once per layer call. This times the same graphs both
ways — one replay after a sync, as the calibration does, and ``replays`` back to back between
two events, divided — on decode, routed-expert and small prefill shapes; the difference is the
launch the calibration's per-layer points hold.

    python -m deepinfer_sim.calibration.launch_gap --models deepseek-v3,deepseek-v3@tp8
        [--kernels deepseek] [--replays 20] --out FILE.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ..errors import UserError
from .device_cli import add_device_args, measure_to_json

DECODE_SHAPES = ((1, 4096), (8, 4096), (32, 2048), (64, 4096), (128, 4096), (256, 1024))
MOE_SHAPES = ((8, 16), (8, 256), (32, 64), (32, 1024), (128, 16), (128, 512))
PREFILL_TOKENS = (128, 512, 2048)


def single_and_amortized(
    bench: Any, fn: Callable[[], object], reset: Callable[[], None], replays: int
) -> tuple[float, float]:
    """(the calibration's time of ``fn`` on ``bench`` — one graph replay after a sync where it
    replays one —, seconds per call of the same call ``replays`` times back to back), medians
    over the bench's repeats. On the CPU (no graphs) the call is readied before each."""
    from ..kernels._util import time_once

    single, _, call, ready = bench.timed_call(fn, reset)

    def back_to_back() -> None:
        for _ in range(replays):
            ready()
            call()

    per = [time_once(back_to_back, bench.device) / replays for _ in range(bench.repeats)]
    return single, float(np.median(per))


def _moe_call(bench: Any, experts: int, tokens: int) -> tuple[Any, Any]:
    return bench.moe_call(experts, tokens), (lambda: None)


def measure(
    models: list[str],
    device: str,
    kernels: str,
    replays: int,
    hardware: str | None = None,
    decode_shapes: tuple[tuple[int, int], ...] = DECODE_SHAPES,
    moe_shapes: tuple[tuple[int, int], ...] = MOE_SHAPES,
    prefill_tokens: tuple[int, ...] = PREFILL_TOKENS,
    repeats: int = 7,
) -> dict[str, Any]:
    from .torch_bench import TorchBench

    out: dict[str, Any] = {"replays": replays, "models": {}}
    for name in models:
        bench = TorchBench(
            device,
            name,
            hardware,
            backend=kernels,
            repeats=repeats,
            max_prefix=0,
            max_chunk=max(prefill_tokens),
            max_batch=max(b for b, _ in decode_shapes),
            max_context=max(c for _, c in decode_shapes),
        )
        bench.warmup()
        kind = bench.kinds[0]
        experts = bench.spec.moe.routed_experts
        # each call built just before it is timed: one expert set and its pools at a time
        calls: list[tuple[str, tuple[int, ...], Callable[[], tuple[Any, Any]]]] = [
            ("decode", (b, c), partial(bench.decode_call, kind, b, c, 1)) for b, c in decode_shapes
        ]
        calls += [
            ("moe", (min(e, experts), t), partial(_moe_call, bench, min(e, experts), t))
            for e, t in moe_shapes
        ]
        calls += [
            ("prefill", (n, 0), partial(bench.prefill_call, kind, n, 0)) for n in prefill_tokens
        ]
        rows: list[dict[str, Any]] = []
        for part, shape, build in calls:
            fn, reset = build()
            single, amortized = single_and_amortized(bench, fn, reset, replays)
            rows.append(
                {
                    "part": part,
                    "shape": list(shape),
                    "single_s": single,
                    "amortized_s": amortized,
                    "gap_s": single - amortized,
                }
            )
            print(
                f"{name} {part} {shape}: one replay {single * 1e6:.1f} us, back to back "
                f"{amortized * 1e6:.1f} us, gap {(single - amortized) * 1e6:.1f} us",
                flush=True,
            )
        gaps = {
            part: float(np.median([r["gap_s"] for r in rows if r["part"] == part]))
            for part in ("decode", "moe", "prefill")
        }
        out["models"][bench.spec.name] = {"kind": kind, "median_gap_s": gaps, "rows": rows}
        out.update(device=bench.device_name, kernels=bench.kernels, software=bench.software)
        bench.release_kernels()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="launch_gap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="deepseek-v3,deepseek-v3@tp8,deepseek-v4.1-flash")
    ap.add_argument("--replays", type=int, default=20)
    add_device_args(ap)
    args = ap.parse_args(argv)

    def run() -> dict[str, Any]:
        if args.replays < 2:
            raise UserError("--replays must be at least 2")
        models = [m for m in args.models.split(",") if m]
        if not models:
            raise UserError("--models: none given")
        return measure(models, args.device, args.kernels, args.replays, args.hardware)

    return 0 if measure_to_json(args.out, run) is not None else 2


if __name__ == "__main__":
    sys.exit(main())
