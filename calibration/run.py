"""``deepinfer-sim calibrate``: measure on a device, fit, write a profile (and print the fits).

One run calibrates one or more models (``--model``, repeatable) with one kernel backend
(``--kernels``); each model is measured by its own :class:`~.torch_bench.TorchBench` (one layer
at a time at its widths) and the per-model profiles are merged into one file. Runs on separate
machines (one GPU slot per model, say) are combined afterwards with ``merge-profiles``.

While a model is measured, its kernel measurements so far are kept beside ``--out`` in
``<out>.<model>.partial.json`` (a profile's ``raw`` layout), so a run cut short by a device
call's time limit keeps what it timed; the file is removed once the profile is written.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import UserError
from ..models.profile import FitError, Profile, merge_profiles, write_profile
from ..models.registry import load_model
from .fit import PREFILL_FORMS, PrefillForm
from .sweep import (
    Grid,
    Measurements,
    build_profile,
    fit_attention,
    fit_experts_alone,
    fit_routed,
    measure,
    measurements_of,
    prefill_wave_tiles,
    raw_of,
    verify_tiles,
)


def run_calibration(
    device: str,
    out: Path,
    grid: str | Grid = "full",
    hardware: str | None = None,
    name: str | None = None,
    models: Sequence[str] = ("deepseek-v4.1-flash",),
    kernels: str = "reference",
    vision: bool = True,
    engine: bool = True,
    log: Callable[[str], None] | None = None,
    decode_spread: float = 0.0,
    engine_depth: int = 1,
) -> Profile:
    """Calibrate ``models`` on ``device`` with the ``kernels`` backend over ``grid`` (``full``,
    ``quick``, ``tiny`` or a Grid); write the (merged) profile to ``out`` and return it.
    ``vision=False`` / ``engine=False`` skip the vision encoder / engine-core step timing;
    ``decode_spread`` times decode batches of mixed context lengths (``Grid.decode_spread``);
    ``engine_depth`` is the layers per group of the timed engine stack (``Grid.engine_depth``)."""
    try:
        import torch
    except ImportError:
        raise UserError("calibrate needs torch: pip install 'deepinfer-sim[calibrate]'") from None
    from .torch_bench import TorchBench

    say = log or (lambda s: print(s, flush=True))
    if not models:
        raise UserError("calibrate needs at least one --model")
    g = Grid.named(grid) if isinstance(grid, str) else grid
    if not vision:
        g = dataclasses.replace(g, vision=False)
    if not engine:
        g = dataclasses.replace(g, engine_decode=(), engine_prefill=())
    if decode_spread:
        g = dataclasses.replace(g, decode_spread=decode_spread)
    if engine_depth != 1:
        g = dataclasses.replace(g, engine_depth=engine_depth)
    t0 = time.perf_counter()
    command = "deepinfer-sim calibrate " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else ""
    profiles: list[Profile] = []
    partials: list[Path] = []
    for model in models:
        bench = TorchBench(
            device=device, model=model, hardware=hardware, backend=kernels, **g.bench_sizes()
        )
        counts = g.count(len(bench.kinds))
        say(
            f"calibrating {bench.spec.name} ({', '.join(bench.kinds)} + moe) with the "
            f"{bench.kernels} kernels on {bench.device_name} ({bench.hardware}), torch "
            f"{bench.software['torch']}, CUDA {bench.software['cuda']}; {g.name} grid: "
            f"{counts['grid']} shapes + {counts['offgrid']} off-grid"
        )
        partial = partial_path(out, bench.spec.name)
        partials.append(partial)
        m = measure(
            bench,
            g,
            log=say,
            checkpoint=functools.partial(
                save_partial, path=partial, model=model, hardware=bench.hardware
            ),
        )
        prof = build_profile(bench, m, name or f"{bench.hardware}-{bench.kernels}", command=command)
        say(f"dtypes measured: {bench.dtypes.model_dump()}")
        print_fits(prof, say)
        profiles.append(prof)
        del bench
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    final = profiles[0] if len(profiles) == 1 else merge_profiles(profiles, profiles[0].name)
    write_profile(final, out)
    for path in partials:
        path.unlink(missing_ok=True)
    say(f"wrote {out} in {time.perf_counter() - t0:.0f} s")
    return final


def partial_path(out: Path, model: str) -> Path:
    """Where a run writing ``out`` keeps ``model``'s measurements while it runs."""
    return out.with_name(f"{out.stem}.{model}.partial.json")


def save_partial(m: Measurements, path: Path, model: str, hardware: str) -> None:
    """``model``'s kernel measurements so far on ``hardware``, in a profile's ``raw`` layout,
    replaced atomically: a run killed part-way (a device call's time limit) keeps what it timed;
    removed when the profile is written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"model": model, "hardware": hardware, "raw": raw_of(m)}) + "\n")
    tmp.replace(path)


def print_fits(profile: Profile, say: Callable[[str], None] = print) -> None:
    """One line per fit: training MAPE on the grid, MAPE and max error off the grid."""
    for model, fits in profile.models.items():
        for line in fit_lines(model, fits.fit):
            say(line)


def fit_lines(model: str, fits: dict[str, FitError]) -> list[str]:
    """``print_fits``' table for one model's fits: a header, then a line per fit."""
    lines = [f"{model:<14} {'train MAPE':>10} {'off-grid MAPE':>14} {'max off-grid':>13} points"]
    for key, f in fits.items():
        off = "-" if f.offgrid_mape is None else f"{f.offgrid_mape:.2%}"
        worst = "-" if f.offgrid_max_ape is None else f"{f.offgrid_max_ape:.2%}"
        lines.append(
            f"  {key:<12} {f.train_mape:>10.2%} {off:>14} {worst:>13} {f.n_train}+{f.n_offgrid}"
        )
    return lines


def partial_fits(
    path: Path, prefill_forms: tuple[PrefillForm, ...] = PREFILL_FORMS
) -> dict[str, FitError]:
    """The attention fits (and the routed experts', if timed) of a cut-short run's
    ``<out>.<model>.partial.json``, with their errors."""
    try:
        saved = json.loads(path.read_text())
        m, model = measurements_of(saved["raw"]), load_model(saved["model"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a calibration's partial measurements ({exc})") from None
    hardware = saved.get("hardware")  # not kept by runs before 2026-12-07
    waves = prefill_wave_tiles(model, hardware) if isinstance(hardware, str) else 0.0
    fits = fit_attention(m, prefill_forms, verify_tiles(model), waves)[2]
    if len(m.moe) >= 4:
        fits["moe"] = fit_routed(m, model.moe.top_k)[1]
    fit_experts_alone(m, model.moe.top_k, fits)
    return fits
