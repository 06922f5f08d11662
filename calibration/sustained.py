"""A layer's time under sustained load against the calibration's short timing of it.

The calibration times each shape as the median of a few synchronized calls after one warm-up
(``TorchBench._measure``): a fraction of a second of work per shape, on a GPU that idled before.
A prefill server runs the same kernels back to back for hours, at its power limit and warm. This
times one call three ways on the same GPU:

* ``burst``: exactly as the calibration does (after ``TorchBench.warmup``);
* ``sustained``: the same call back to back for ``seconds`` (replayed as a CUDA graph where the
  calibration would replay one), every call timed with CUDA events, read in windows of about
  half a second (``--window``); its figure is the median over the last third of the windows;
* ``burst_hot``: the calibration's way again straight after, the GPU still warm;

and samples the SM clock, power and temperature (``nvidia-smi``, every 100 ms) in each phase.
With ``--duty D`` < 1 the sustained phase idles after each call (after every ``--group K``
calls) so that the GPU is busy a share D of the time (each call then timed on the host after a
sync): the slowdown at partial load, and with K how long a burst the power limit averages over.
Workloads (``--workloads``, comma-separated): ``prefill:N`` (one attention block's prefill of
an N-token chunk, no prefix), ``experts:LxT`` (the routed experts' own work, T tokens over L
local experts), ``layer:N`` (both: a layer of an N-token chunk with N tokens' routed rows over
the local experts of ``--ep`` ranks with ``--redundant-per-gpu``, default 32 and 1: 9 for V3),
``decode:BxC`` (a decode step of B sequences of C tokens: the memory-bound control).

    python -m deepinfer_sim.calibration.sustained --model deepseek-v3 [--kernels deepseek]
        [--workloads layer:8192,decode:128x4096] [--seconds 20] [--cool 5] [--duty 1] [--group 1]
        [--window 0.5] [--ep 32] [--redundant-per-gpu 1]
        --out FILE.json
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UserError
from .device_cli import add_device_args, measure_to_json

WINDOW_S = 0.5


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # prefill | experts | layer | decode
    sizes: tuple[int, ...]


def parse_workloads(text: str) -> list[Workload]:
    """``prefill:8192,experts:9x9216,layer:8192,decode:128x4096`` → workloads, or a UserError
    naming the item that is wrong."""
    arity = {"prefill": 1, "experts": 2, "layer": 1, "decode": 2}
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        kind, _, sizes = item.partition(":")
        if kind not in arity:
            raise UserError(f"--workloads {item!r}: kind must be one of {', '.join(arity)}")
        try:
            nums = tuple(int(v) for v in sizes.split("x"))
        except ValueError:
            nums = ()
        if len(nums) != arity[kind] or min(nums) < 1:
            form = "N" if arity[kind] == 1 else "AxB"
            raise UserError(f"--workloads {item!r}: {kind} takes {form}, positive integers")
        out.append(Workload(item, kind, nums))
    if not out:
        raise UserError("--workloads: none given")
    return out


def build_call(
    bench: Any, w: Workload, layer_experts: int
) -> tuple[Callable[[], object], Callable[[], None]]:
    """The workload's call and what readies it before each, on ``bench`` (a TorchBench);
    ``layer_experts``: the local experts of a ``layer`` workload."""
    kind = bench.kinds[0]
    if w.kind == "prefill":
        return bench.prefill_call(kind, w.sizes[0], 0)
    if w.kind == "experts":
        local = min(w.sizes[0], bench.spec.moe.routed_experts)
        return bench.moe_experts_call(local, w.sizes[1]), lambda: None
    if w.kind == "decode":
        return bench.decode_call(kind, w.sizes[0], w.sizes[1], 1)
    attn, reset = bench.prefill_call(kind, w.sizes[0], 0)
    experts = bench.moe_experts_call(layer_experts, w.sizes[0])

    def layer() -> None:
        attn()
        experts()

    return layer, reset


def sustained_windows(
    fn: Callable[[], object],
    reset: Callable[[], None],
    seconds: float,
    cuda: bool,
    duty: float = 1.0,
    group: int = 1,
    window: float = WINDOW_S,
) -> list[tuple[float, float, int]]:
    """``fn`` back to back for ``seconds`` (``duty`` < 1: every ``group`` calls followed by an
    idle gap that leaves the GPU busy that share of the time — the same share in longer bursts
    as ``group`` grows): per window of ~``window`` seconds, (seconds since the start at its
    end, median seconds per call, calls)."""
    import torch

    out: list[tuple[float, float, int]] = []
    t0 = time.perf_counter()
    while (now := time.perf_counter() - t0) < seconds:
        times: list[float] = []
        if duty < 1.0:
            while time.perf_counter() - t0 - now < window:
                busy = 0.0
                for _ in range(group):
                    reset()
                    if cuda:
                        torch.cuda.synchronize()
                    s = time.perf_counter()
                    fn()
                    if cuda:
                        torch.cuda.synchronize()
                    dt = time.perf_counter() - s
                    times.append(dt)
                    busy += dt
                time.sleep(busy * (1.0 / duty - 1.0))
        elif cuda:
            pairs = []
            while time.perf_counter() - t0 - now < window:
                reset()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                pairs.append((a, b))
                if len(pairs) >= 4:  # keep the host at most a few calls ahead
                    pairs[-4][1].synchronize()
            pairs[-1][1].synchronize()
            times = [a.elapsed_time(b) / 1e3 for a, b in pairs]
        else:
            while time.perf_counter() - t0 - now < window:
                reset()
                s = time.perf_counter()
                fn()
                times.append(time.perf_counter() - s)
        out.append((time.perf_counter() - t0, float(np.median(times)), len(times)))
    return out


class ClockSampler:
    """``nvidia-smi``'s SM clock, power and temperature every 100 ms while open (nothing where
    there is no nvidia-smi); ``summary(t0, t1)`` over the samples between two ``time.time()``s."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float, float]] = []
        # open for the sampler's lifetime: nvidia-smi writes to it until close()
        self._file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)  # noqa: SIM115
        exe = shutil.which("nvidia-smi")
        query = "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu"
        self._proc = (
            subprocess.Popen(
                [exe, query, "--format=csv,noheader,nounits", "-lms", "100"],
                stdout=self._file,
                stderr=subprocess.DEVNULL,
            )
            if exe
            else None
        )

    def close(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
        self._file.flush()
        self._file.seek(0)
        self.rows = parse_clock_rows(self._file.read())
        self._file.close()
        Path(self._file.name).unlink(missing_ok=True)

    def summary(self, t0: float, t1: float) -> dict[str, float] | None:
        sel = [r for r in self.rows if t0 <= r[0] <= t1]
        if not sel:
            return None
        a = np.array(sel)
        return {
            "samples": len(sel),
            "sm_mhz_median": float(np.median(a[:, 1])),
            "sm_mhz_min": float(a[:, 1].min()),
            "power_w_median": float(np.median(a[:, 2])),
            "temp_c_max": float(a[:, 3].max()),
        }


def parse_clock_rows(text: str) -> list[tuple[float, float, float, float]]:
    """nvidia-smi's ``timestamp, sm MHz, W, °C`` lines → (epoch seconds, MHz, W, °C); lines
    that do not parse (a header, a clipped last line, "[N/A]") are left out."""
    from datetime import datetime

    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:
            ts = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append((ts, float(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return rows


def measure(
    model: str,
    workloads: list[Workload],
    seconds: float,
    cool: float,
    device: str,
    kernels: str,
    hardware: str | None = None,
    duty: float = 1.0,
    group: int = 1,
    ep: int = 32,
    redundant_per_gpu: int = 1,
    window: float = WINDOW_S,
) -> dict[str, Any]:
    """``ep``, ``redundant_per_gpu``: the deployment whose local experts a ``layer`` workload's
    experts are (the model's routed experts / ep + redundant, rounded up)."""
    from .torch_bench import TorchBench

    bench = TorchBench(device, model, hardware, backend=kernels, max_batch=256)
    layer_experts = min(
        math.ceil(bench.spec.experts_per_gpu(ep, redundant_per_gpu)),
        bench.spec.moe.routed_experts,
    )
    sampler = ClockSampler()
    results: list[dict[str, Any]] = []
    phases: list[dict[str, tuple[float, float]]] = []
    try:
        bench.warmup()
        for w in workloads:
            fn, reset = build_call(bench, w, layer_experts)
            t_a = time.time()
            burst, _, call, ready = bench.timed_call(
                fn, reset
            )  # a graph's replay where it times one
            t_b = time.time()
            windows = sustained_windows(call, ready, seconds, bench.cuda, duty, group, window)
            t_c = time.time()
            hot = bench.timed_call(fn, reset)[0]
            t_d = time.time()
            last = [s for _, s, _ in windows[len(windows) - max(1, len(windows) // 3) :]]
            sustained = float(np.median(last))
            results.append(
                {
                    "workload": w.name,
                    "graphed": call is not fn,
                    "burst_s": burst,
                    "sustained_s": sustained,
                    "burst_hot_s": hot,
                    "sustained_over_burst": sustained / burst,
                    "hot_over_burst": hot / burst,
                    "windows": [[round(t, 3), s, n] for t, s, n in windows],
                }
            )
            phases.append({"burst": (t_a, t_b), "sustained": (t_b, t_c), "hot": (t_c, t_d)})
            print(
                f"{w.name}: burst {burst * 1e3:.3f} ms, sustained {sustained * 1e3:.3f} ms "
                f"({sustained / burst:.3f}x), hot burst {hot * 1e3:.3f} ms ({hot / burst:.3f}x)",
                flush=True,
            )
            time.sleep(cool)
    finally:
        sampler.close()
    for r, phase in zip(results, phases, strict=True):
        r["clocks"] = {k: sampler.summary(*v) for k, v in phase.items()}
    return {
        "model": bench.spec.name,
        "device": bench.device_name,
        "kernels": bench.kernels,
        "software": bench.software,
        "seconds": seconds,
        "duty": duty,
        "group": group,
        "layer_experts": layer_experts,
        "window_s": window,
        "workloads": results,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="sustained", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--workloads", default="layer:8192,prefill:8192,experts:9x8192,decode:128x4096")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--cool", type=float, default=5.0, help="idle seconds between workloads")
    ap.add_argument(
        "--duty", type=float, default=1.0, help="busy share of the sustained phase (0 < D <= 1)"
    )
    ap.add_argument(
        "--group", type=int, default=1, help="with --duty: calls back to back between idle gaps"
    )
    ap.add_argument(
        "--window", type=float, default=WINDOW_S, help="seconds per window of the sustained phase"
    )
    ap.add_argument("--ep", type=int, default=32, help="a layer workload's expert parallelism")
    ap.add_argument(
        "--redundant-per-gpu", type=int, default=1, help="a layer workload's redundant experts"
    )
    add_device_args(ap)
    args = ap.parse_args(argv)

    def run() -> dict[str, Any]:
        if args.seconds <= 0 or args.cool < 0:
            raise UserError("--seconds must be positive and --cool not negative")
        if not 0 < args.duty <= 1:
            raise UserError(f"--duty {args.duty}: a busy share in (0, 1]")
        if args.window <= 0:
            raise UserError(f"--window {args.window}: seconds, positive")
        if args.group < 1:
            raise UserError(f"--group {args.group}: at least one call")
        if args.ep < 1 or args.redundant_per_gpu < 0:
            raise UserError("--ep must be positive and --redundant-per-gpu not negative")
        workloads = parse_workloads(args.workloads)
        return measure(
            args.model,
            workloads,
            args.seconds,
            args.cool,
            args.device,
            args.kernels,
            args.hardware,
            args.duty,
            args.group,
            args.ep,
            args.redundant_per_gpu,
            args.window,
        )

    return 0 if measure_to_json(args.out, run) is not None else 2


if __name__ == "__main__":
    sys.exit(main())
