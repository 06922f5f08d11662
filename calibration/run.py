"""``deepinfer-sim calibrate``: measure on a device, fit, write a profile (and print the fits)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .profile import write_profile
from .sweep import Grid, build_profile, measure


def run_calibration(
    device: str,
    out: Path,
    quick: bool,
    hardware: str | None = None,
    name: str | None = None,
    model: str = "deepseek-v4.1-flash",
) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        from ..errors import UserError

        raise UserError("calibrate needs torch: pip install 'deepinfer-sim[calibrate]'") from None
    from .torch_bench import TorchBench

    t0 = time.perf_counter()
    bench = TorchBench(device=device, model=model, hardware=hardware)
    print(
        f"calibrating on {bench.device_name} ({bench.hardware}), torch {bench.software['torch']}"
        f", CUDA {bench.software['cuda']}, dtypes {bench.dtypes.model_dump()}",
        flush=True,
    )
    grid = Grid.quick() if quick else Grid()
    m = measure(bench, grid, log=lambda s: print(s, flush=True))
    command = "deepinfer-sim calibrate " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else ""
    profile = build_profile(
        bench, m, name or f"{bench.hardware}-measured", model, command, top_k=bench.spec.moe.top_k
    )
    write_profile(profile, out)
    print(f"{'fit':<14} {'train MAPE':>10} {'held-out MAPE':>14} {'max held-out':>13} points")
    for key, f in profile.fit.items():
        print(
            f"{key:<14} {f.train_mape:>10.2%} {f.heldout_mape:>14.2%} {f.heldout_max_ape:>13.2%} "
            f"{f.n_train}+{f.n_heldout}"
        )
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s (sweep {m.seconds:.0f} s)", flush=True)
