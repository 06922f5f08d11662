"""Re-fit a measured profile from the raw measurements it keeps.

    python -m deepinfer_sim.calibration.refit IN.yaml OUT.yaml [--kernels
        [--prefill-forms smooth,prefix,merge,waves]] [--a2a-from PROFILE]
    python -m deepinfer_sim.calibration.refit --partial OUT.MODEL.partial.json [--json FILE]

A profile keeps its raw measurements, so a better fit form needs no new GPU time. With
``--kernels`` the kernel fits (prefill and decode per attention kind, routed experts) are re-fitted
from ``raw`` by the calibration's own code (``sweep.fit_kernels``), with their errors;
``--prefill-forms smooth,prefix`` lets cross-validation also try the prefill form with a fixed
cost per chunk that has a prefix, ``merge`` with a cost per new token of such a chunk, ``waves``
with the prefix attention's new tokens counted in whole waves of query tiles (``fit.fit_prefill``;
the shipped profile's prefill fits chose among all four; not the default yet). The routed-expert
fit chooses by cross-validation between weight reads and GEMMs that add up (k = 1) and a smooth
combination with a fitted k (``fit.fit_moe``), so a profile shipped additive may come back
smooth. Then, always, ``sweep.fit_engine_overhead`` (the engine core's host time per step, the
replay loop's gaps, and the choice between the additive and the overlapping eager-prefill forms)
re-runs on every model's stored ``raw.engine`` rows against that model's kernel fits. The profile
is written back with a note in its provenance.

``--partial`` prints the fits and their errors from what a calibration cut short had timed
(``calibrate`` keeps ``<out>.<model>.partial.json`` beside its output while it runs).

``--a2a-from`` carries a measured all-to-all (latency and link efficiency of NCCL between two
GPUs of the same kind, and its raw points) into a profile measured on one GPU, whose all-to-all
is only modelled; the provenance says from where.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import cast, get_args

from ..errors import UserError
from ..models.profile import EngineOverhead, Profile, load_profile, write_profile
from ..models.registry import load_model
from .fit import PREFILL_FORMS, PrefillForm
from .run import fit_lines, partial_fits
from .sweep import (
    engine_stack,
    fit_engine_overhead,
    fit_experts_alone,
    fit_kernels,
    measurements_of,
    prefill_wave_tiles,
    verify_tiles,
)


def _noted(profile: Profile, models: dict, note: str) -> Profile:
    return profile.model_copy(
        update={
            "models": models,
            "provenance": profile.provenance.model_copy(
                update={"note": profile.provenance.note + note}
            ),
        }
    )


def refit_kernels(
    profile: Profile, prefill_forms: tuple[PrefillForm, ...] = PREFILL_FORMS
) -> Profile:
    """Every model's kernel fits and fit errors re-fitted from its raw grid and off-grid points
    (all else — all-to-all, vision, host overheads — kept); ``prefill_forms``: the prefill forms
    to choose from (``fit.fit_prefill``)."""
    if profile.provenance.kind != "measured":
        raise UserError(
            f"{profile.name}: only a measured profile has raw kernel measurements to re-fit"
        )
    models = {}
    for name, fits in profile.models.items():
        m, spec = measurements_of(fits.raw), load_model(name)
        top_k = spec.moe.top_k
        (hw,) = fits.hardware  # a measured profile: one device per model
        waves = prefill_wave_tiles(spec, hw)
        prefill, decode, moe, errors = fit_kernels(
            m, top_k, prefill_forms, verify_tiles(spec), waves
        )
        alone = fit_experts_alone(m, top_k, errors)
        update = {"prefill": prefill, "decode": decode, "moe": moe, "moe_experts": alone}
        hardware = {hw: c.model_copy(update=update) for hw, c in fits.hardware.items()}
        models[name] = fits.model_copy(update={"hardware": hardware, "fit": errors})
    return _noted(profile, models, "; kernel fits re-fitted from raw (refit.py --kernels)")


def refit_engine(profile: Profile) -> Profile:
    if profile.provenance.kind != "measured":
        raise UserError(f"{profile.name}: only a measured profile has raw engine steps to re-fit")
    models = {}
    for name, fits in profile.models.items():
        rows = [
            (str(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]))
            for r in fits.raw.get("engine", [])
        ]
        hardware = {}
        for hw, coefs in fits.hardware.items():
            if rows:
                depth = coefs.engine_overhead.stack_depth
                bare = coefs.model_copy(update={"engine_overhead": EngineOverhead()})
                stack = engine_stack(load_model(name), depth=depth)
                eng = fit_engine_overhead(bare, hw, rows, stack)
                coefs = coefs.model_copy(
                    update={"engine_overhead": eng.model_copy(update={"stack_depth": depth})}
                )
            hardware[hw] = coefs
        models[name] = fits.model_copy(update={"hardware": hardware})
    return _noted(profile, models, "; engine-core model re-fitted from raw.engine (refit.py)")


def carry_a2a(profile: Profile, source: Profile) -> Profile:
    """``profile`` with the measured all-to-all of ``source`` (same device) in every model."""
    (src,) = source.models.values() if len(source.models) == 1 else (None,)
    if src is None or not all(c.a2a.measured for c in src.hardware.values()):
        raise UserError(f"{source.name} has no single measured all-to-all to carry")
    if source.provenance.device != profile.provenance.device:
        raise UserError("the all-to-all must come from the same kind of device")
    models = {}
    for name, fits in profile.models.items():
        hardware = {
            hw: c.model_copy(update={"a2a": src.hardware[hw].a2a})
            for hw, c in fits.hardware.items()
        }
        raw = {**fits.raw, "a2a": src.raw.get("a2a", [])}
        models[name] = fits.model_copy(update={"hardware": hardware, "raw": raw})
    return _noted(
        profile,
        models,
        f"; all-to-all measured over NCCL between two GPUs, carried from {source.name}"
        f" ({source.provenance.date})",
    )


def _forms(text: str) -> tuple[PrefillForm, ...]:
    names = tuple(text.split(","))
    if not names or set(names) - set(get_args(PrefillForm)):
        raise argparse.ArgumentTypeError(
            f"choose from {', '.join(get_args(PrefillForm))} (got {text})"
        )
    return cast("tuple[PrefillForm, ...]", names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m deepinfer_sim.calibration.refit",
        description="Re-fit a measured profile from its raw measurements (IN.yaml OUT.yaml), or "
        "fit a cut-short calibration's partial measurements (--partial FILE).",
    )
    ap.add_argument("paths", nargs="*", metavar="IN.yaml OUT.yaml")
    ap.add_argument("--kernels", action="store_true", help="re-fit the kernel fits too")
    ap.add_argument("--prefill-forms", type=_forms, default=PREFILL_FORMS)
    ap.add_argument("--a2a-from", metavar="PROFILE")
    ap.add_argument("--partial", type=Path, metavar="FILE")
    ap.add_argument("--json", type=Path, metavar="FILE", help="with --partial: the fits as JSON")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    forms: tuple[PrefillForm, ...] = args.prefill_forms
    if args.partial is not None:
        path: Path = args.partial
        if args.paths:
            ap.error("--partial takes no IN.yaml OUT.yaml")
        if not path.is_file():
            print(f"error: --partial: no file {path}", file=sys.stderr)
            return 2
        try:
            fits = partial_fits(path, forms)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print("\n".join(fit_lines(path.name, fits)))
        if args.json is not None:
            table = {key: f.model_dump() for key, f in fits.items()}
            args.json.write_text(json.dumps(table, indent=2) + "\n")
        return 0
    if len(args.paths) != 2:
        ap.error("give IN.yaml and OUT.yaml (or --partial FILE)")
    try:
        profile = load_profile(args.paths[0])
        if args.kernels:
            profile = refit_kernels(profile, forms)
        profile = refit_engine(profile)
        if args.a2a_from:
            profile = carry_a2a(profile, load_profile(args.a2a_from))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_profile(profile, Path(args.paths[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
