"""Derive a profile for hardware that is not at hand from a measured one, by roofline ratios.

Each fitted coefficient is a time per unit of some work, and each kind of work is bound by one
resource, so a coefficient moves to other hardware by the ratio of that resource's rate — taken
in the dtype it was **measured** in on the source hardware versus the dtype the **model** uses on
the target. The model's dtype counts only where the target has units for it: MXFP4 experts run at
the FP4 rate and read MXFP4 bytes on SM100 or Ascend 950, but on an H200, which has no FP4, they
stay in the measured dtype (FP8). So deriving for the hardware a profile was measured on, in the
model's own dtypes, returns the measured coefficients unchanged.

The ratios (``mem`` = HBM bandwidth ratio; ``dense``/``expert``/``attn`` = tensor-rate ratios
of the dense, expert and attention-compute dtypes; ``*_bytes`` = bytes-per-element ratios, target
dtype / measured dtype, of the dense weights, expert weights and main KV cache) and which
coefficient each one scales live in one place, ``models/precision.py`` (``Ratios``,
``scale_coefs`` and its table), which the profile path shares: there the same table, on one
hardware, moves a fit to a model whose dtypes differ from those the fit is in (``dtype_rule``).
A derived entry's coefficients are in the model's dtypes where the target has units for them
(``target_dtype``) and in the measured ones elsewhere; the profile path applies the rest (MXFP4
experts on an H800: their bytes, at the FP8 rate) and says so.

Only a measured profile with one hardware entry per model can be derived from (a derived
profile would compound two derivations); every model in it is derived. The derived profile's
header says "derived, not measured", from what and how. Re-running ``deepinfer-sim calibrate`` on
the target hardware replaces it with a measurement.
"""

from __future__ import annotations

from ..errors import ConfigError, UserError
from ..models.precision import Ratios, scale_coefs, target_dtype
from ..models.profile import ModelFits, Profile, Provenance
from ..models.registry import load_hardware, load_model

__all__ = ["METHOD", "Ratios", "derive", "scale_coefs", "target_dtype"]

METHOD = (
    "derived, not measured: every coefficient of the measured profile scaled by the ratio of the "
    "resource that bounds it (dense/attention/expert tensor rate, HBM bandwidth, weight and KV "
    "bytes per element), from the dtype measured to the model's dtype where the target has units "
    "for it; all-to-all latency and link efficiency kept, link bandwidth from the target "
    "hardware spec. See calibration/derive.py."
)


def derive(measured: Profile, name: str, targets: list[str]) -> Profile:
    """A profile for ``targets`` (hardware names) derived from ``measured``: every model's only
    hardware entry, scaled by that model's own dtypes."""
    prov = measured.provenance
    if prov.kind != "measured":
        raise UserError(
            f"profile {measured.name!r} is derived (from {prov.derived_from}), not measured: "
            "derive from the measured profile instead"
        )
    if not targets:
        raise UserError("derive needs at least one target hardware")
    dsts = {t: load_hardware(t) for t in targets}
    models: dict[str, ModelFits] = {}
    sources: set[str] = set()
    for model_name, fits in measured.models.items():
        if len(fits.hardware) != 1:
            raise UserError(
                f"profile {measured.name!r} has {len(fits.hardware)} hardware entries for model "
                f"{model_name!r} ({', '.join(sorted(fits.hardware))}); derive from a measured "
                "profile with one"
            )
        try:
            precision = load_model(model_name).precision
        except ConfigError as exc:
            raise UserError(
                f"cannot derive model {model_name!r}: its precisions come from the bundled model "
                f"of that name ({exc})"
            ) from None
        ((src_name, base),) = fits.hardware.items()
        sources.add(src_name)
        src = load_hardware(src_name)
        models[model_name] = ModelFits(
            dtypes=fits.dtypes,
            widths=fits.widths,
            hardware={
                t: scale_coefs(base, Ratios.of(src, dst, fits.dtypes, precision))
                for t, dst in dsts.items()
            },
            fit=fits.fit,
        )
    return Profile(
        name=name,
        provenance=Provenance(
            kind="derived",
            derived_from=measured.name,
            method=METHOD,
            kernels=prov.kernels,
            kernel_versions=prov.kernel_versions,
            note=f"measured on {prov.device} ({', '.join(sorted(sources))}); targets "
            + ", ".join(targets),
            date=prov.date,
        ),
        models=models,
    )
