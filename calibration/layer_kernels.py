"""The kernels one attention block runs for a decode step, and their device time.

A layer's decode time on the calibration grid (``TorchBench.decode``) is the block's whole call,
replayed as a CUDA graph. This lists what that call launches — each kernel's name, how many
times and for how long (``torch.profiler``, one eager call after a warm-up; the CPU's operators
where there is no GPU) beside the grid's own timing of the call — so a layer's fixed cost can be
read kernel by kernel: which part is the
layer's own work and which is work an engine does once per step for every layer (index tensors,
the attention kernel's scheduler metadata).

    python -m deepinfer_sim.calibration.layer_kernels --model deepseek-v3 [--kind mla]
        [--batch 1,64] [--context 4096] [--verify 1] [--device cuda] [--kernels deepseek]
        [--hardware NAME] --out FILE.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import UserError
from .device_cli import add_device_args, measure_to_json


def profile_call(fn: Any, cuda: bool, kernels_only: bool = True) -> list[dict[str, Any]]:
    """Each kernel (on a GPU; operator on the CPU) of one call of ``fn``: name, calls and
    microseconds, largest first (``fn`` is called once before, to warm it up). On a GPU,
    ``kernels_only=False`` keeps the operators' rows too, each holding its kernels' time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            import torch

            torch.cuda.synchronize()
    from torch.autograd import DeviceType

    rows = []
    for ev in prof.key_averages():
        if cuda and kernels_only and ev.device_type != DeviceType.CUDA:
            continue  # an operator's row: its kernels have rows of their own
        us = ev.device_time_total if cuda else ev.self_cpu_time_total
        if us > 0:
            rows.append({"name": ev.key[:120], "calls": ev.count, "us": round(float(us), 2)})
    return sorted(rows, key=lambda r: -r["us"])


def layer_kernels(
    model: str,
    kind: str | None,
    batches: list[int],
    context: int,
    verify: int,
    device: str,
    kernels: str,
    hardware: str | None = None,
) -> dict[str, Any]:
    """Per batch size: the block's kernels for one decode step of ``batch`` sequences of
    ``context`` tokens computing ``verify`` tokens each, their count and total time."""
    from .torch_bench import TorchBench

    bench = TorchBench(device, model, hardware, backend=kernels, repeats=1, max_batch=max(batches))
    kind = kind or bench.kinds[0]
    if kind not in bench.kinds:
        raise UserError(f"--kind {kind}: {bench.spec.name} has {', '.join(bench.kinds)}")
    steps = []
    for batch in batches:
        call, ready = bench.decode_call(kind, batch, context, verify)
        ready()
        rows = profile_call(call, bench.cuda)
        steps.append(
            {
                "batch": batch,
                "launches": sum(r["calls"] for r in rows),
                "us": round(sum(r["us"] for r in rows), 2),
                # the calibration grid's own measure of the same call (a CUDA graph's replay)
                "timed_us": round(bench.decode(kind, batch, context, verify) * 1e6, 2),
                "kernels": rows,
            }
        )
    return {
        "model": bench.spec.name,
        "kind": kind,
        "context": context,
        "verify": verify,
        "device": bench.device_name,
        "kernels": bench.kernels,
        "software": bench.software,
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="layer_kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--kind", default=None, help="attention kind (default: the model's first)")
    ap.add_argument("--batch", default="1,64", help="batch sizes, comma-separated")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--verify", type=int, default=1)
    add_device_args(ap)
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batch.split(",") if b]
        if not batches or min(batches) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --batch {args.batch!r}: positive integers, comma-separated", file=sys.stderr)
        return 2
    res = measure_to_json(
        args.out,
        lambda: layer_kernels(
            args.model,
            args.kind,
            batches,
            args.context,
            args.verify,
            args.device,
            args.kernels,
            args.hardware,
        ),
    )
    if res is None:
        return 2
    for step in res["steps"]:
        print(
            f"batch {step['batch']}: {step['launches']} launches, {step['us']:.1f} us"
            f" ({step['timed_us']:.1f} us timed)"
        )
        for r in step["kernels"][:25]:
            print(f"  {r['us']:9.1f} us  x{r['calls']:<3d} {r['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
