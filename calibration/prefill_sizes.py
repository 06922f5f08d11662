"""Why does a 1,500-token prefill chunk cost what a 2,048-token one does? A device diagnostic.

The off-grid prefill points of every V4 layer kind miss at 1,500 new tokens (−11 to −24 %) and
768 (−4 to −12 %), on a grid of powers of two. This times one layer's prefill at chunk sizes in
fine steps (``--sizes``) at several prefixes (``--prefixes``; 20,000 is not a multiple of the
HCA block, 20,480 is) and, for a few sizes (``--profile-sizes``), lists each CUDA kernel's time
from ``torch.profiler``, so the size-dependent kernel shows by name.

``python -m deepinfer_sim.calibration.prefill_sizes --out FILE.json [--device cuda]``
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .torch_bench import TorchBench

SIZES = (*range(1024, 2049, 64), 1500, 768, 640, 896)
PREFIXES = (0, 20000, 20480)
PROFILE_SIZES = (1472, 1500, 1536, 2048)
PROFILE_PREFIX = 20000


def kernel_times(bench: TorchBench, kind: str, n: int, p: int, top: int = 12) -> list[dict]:
    """Each kernel's total device time (else CPU time) in one prefill call, largest first."""
    from torch.profiler import ProfilerActivity, profile

    bench.prefill(kind, n, p)  # builds the block and pool, warms the kernels
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.cuda else [])
    with profile(activities=activities) as prof:
        bench.prefill(kind, n, p)
    rows = []
    for ev in prof.key_averages():
        us = ev.device_time_total if bench.cuda else ev.self_cpu_time_total
        if us > 0:
            rows.append({"name": ev.key[:120], "calls": ev.count, "us": float(us)})
    return sorted(rows, key=lambda r: -r["us"])[:top]


def measure(
    bench: TorchBench,
    sizes: Sequence[int] = SIZES,
    prefixes: Sequence[int] = PREFIXES,
    profile_sizes: Sequence[int] = PROFILE_SIZES,
    profile_prefix: int = PROFILE_PREFIX,
) -> dict[str, Any]:
    timed = [
        {"kind": kind, "n": n, "p": p, "seconds": bench.prefill(kind, n, p)}
        for kind in bench.kinds
        for p in prefixes
        for n in sorted(set(sizes))
    ]
    kernels = {
        f"{kind}/{n}/{profile_prefix}": kernel_times(bench, kind, n, profile_prefix)
        for kind in bench.kinds
        for n in profile_sizes
    }
    return {
        "model": bench.spec.name,
        "kernels": bench.kernels,
        "device": bench.device_name,
        "kernel_versions": bench.kernel_versions,
        "timed": timed,
        "profiled": kernels,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="deepseek-v4.1-flash")
    ap.add_argument("--kernels", default="deepseek", choices=["deepseek", "reference"])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--prefixes", default=",".join(map(str, PREFIXES)))
    ap.add_argument("--profile-sizes", default=",".join(map(str, PROFILE_SIZES)))
    ap.add_argument("--profile-prefix", type=int, default=PROFILE_PREFIX)
    a = ap.parse_args(argv)

    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",") if v]

    sizes, prefixes = ints(a.sizes), ints(a.prefixes)
    bench = TorchBench(
        a.device,
        a.model,
        backend=a.kernels,
        repeats=7,
        max_prefix=max([*prefixes, a.profile_prefix]),
        max_chunk=max(sizes + ints(a.profile_sizes)),
        max_batch=1,
        max_context=1024,
    )
    res = measure(bench, sizes, prefixes, ints(a.profile_sizes), a.profile_prefix)
    a.out.write_text(json.dumps(res, indent=2) + "\n")
    for r in res["timed"]:
        us = r["seconds"] * 1e6
        print(f"{r['kind']} n={r['n']:6d} p={r['p']:6d} {us:9.1f} us {us / r['n']:.3f} us/tok")
    print(res["kernel_versions"])
    for key, rows in res["profiled"].items():
        print(key)
        for k in rows:
            print(f"  {k['us']:9.1f} us {k['calls']:4d}x {k['name']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
