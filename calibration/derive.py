"""Derive a profile for hardware that is not at hand from a measured one, by roofline ratios.

Each fitted coefficient is a time per unit of some work, and each kind of work is bound by one
resource, so a coefficient moves to other hardware by the ratio of that resource's rate — taken
in the dtype it was **measured** in on the source hardware versus the dtype the **model** uses on
the target. The model's dtype counts only where the target has units for it: MXFP4 experts run at
the FP4 rate and read MXFP4 bytes on SM100 or Ascend 950, but on an H200, which has no FP4, they
stay in the measured dtype (FP8). So deriving for the hardware a profile was measured on, in the
model's own dtypes, returns the measured coefficients unchanged.

With ``mem`` = HBM bandwidth ratio, ``dense``/``expert``/``attn`` = tensor-rate ratios of the
dense, expert and attention-compute dtypes, and ``*_bytes`` = bytes-per-element ratios (target
dtype / measured dtype) of the dense weights, expert weights and main KV cache:

================  ================================================  ==========================
coefficient       work                                              scaled by
================  ================================================  ==========================
prefill a         weight reads, launches                            mem × dense_bytes
prefill b         dense GEMMs per token                             dense
prefill c, d      indexer and attention (n·p, n²)                   attn
prefill e         per chunk, the prefix's cached entries (p)        mem × kv_bytes
prefill f         per chunk with a prefix: its extra kernels        mem × dense_bytes (as a)
decode a          launches, sync (not hardware-bound)               kept
decode w          weight reads (the GEMMs' floor)                   mem × dense_bytes
decode b, tile    dense GEMM rows (T, rounded up to the tile)       dense; tile kept
decode steps      the GEMMs' measured staircase over row tiles      dense
decode c          cache reads per context token                     mem × kv_bytes
decode d          per-sequence reads and bookkeeping                mem
decode e          query tokens × context (indexer/attention)        attn
decode q          query tokens (attention over a fixed top-k)       attn
decode h          per context token of the mean sequence            mem × kv_bytes
moe a             launches (not hardware-bound)                     kept
moe e             active experts' weight reads                      mem × expert_bytes
moe f, form/tile  expert GEMM rows                                  expert; form and tile kept
moe k             how much weight reads and GEMMs overlap           kept
moe_experts       the experts alone (EP ranks): as moe              as moe
vision            seconds per image                                 bf16 rate
a2a               latency, link efficiency                          kept (links: target spec)
host / engine     launch gaps, engine host time                     kept
================  ================================================  ==========================

Only a measured profile with one hardware entry per model can be derived from (a derived
profile would compound two derivations); every model in it is derived. The derived profile's
header says "derived, not measured", from what and how. Re-running ``deepinfer-sim calibrate`` on
the target hardware replaces it with a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, UserError
from ..models.hardware import HardwareSpec
from ..models.profile import Dtypes, HardwareCoefs, ModelFits, MoeCoef, Profile, Provenance
from ..models.registry import load_hardware, load_model
from ..models.spec import Precision, compute_class, dtype_bytes

METHOD = (
    "derived, not measured: every coefficient of the measured profile scaled by the ratio of the "
    "resource that bounds it (dense/attention/expert tensor rate, HBM bandwidth, weight and KV "
    "bytes per element), from the dtype measured to the model's dtype where the target has units "
    "for it; all-to-all latency and link efficiency kept, link bandwidth from the target "
    "hardware spec. See calibration/derive.py."
)


def target_dtype(model_dtype: str, measured_dtype: str, hw: HardwareSpec) -> str:
    """The dtype a model's ``model_dtype`` tensors run in on ``hw``: its own where ``hw`` has
    tensor units for it, else the dtype they were measured in."""
    cls = compute_class(model_dtype)
    if cls in ("fp4", "fp8") and getattr(hw.flops_per_s, cls) is None:
        return measured_dtype
    return model_dtype


@dataclass(frozen=True)
class Ratios:
    """Target time / source time per unit of each kind of work."""

    mem: float
    dense: float
    dense_bytes: float
    expert: float
    expert_bytes: float
    attn: float
    kv_bytes: float
    vision: float

    @classmethod
    def of(cls, src: HardwareSpec, dst: HardwareSpec, measured: Dtypes, model: Precision) -> Ratios:
        def rate(hw: HardwareSpec, dtype: str) -> float:
            return hw.flops(compute_class(dtype))

        dense = target_dtype(model.dense, measured.dense, dst)
        expert = target_dtype(model.experts, measured.experts, dst)
        kv = target_dtype(model.kv_main, measured.kv_cache, dst)
        return cls(
            mem=src.hbm_bytes_per_s / dst.hbm_bytes_per_s,
            dense=rate(src, measured.dense) / rate(dst, dense),
            dense_bytes=dtype_bytes(dense) / dtype_bytes(measured.dense),
            expert=rate(src, measured.experts) / rate(dst, expert),
            expert_bytes=dtype_bytes(expert) / dtype_bytes(measured.experts),
            attn=rate(src, measured.attention) / rate(dst, measured.attention),
            kv_bytes=dtype_bytes(kv) / dtype_bytes(measured.kv_cache),
            vision=src.flops("bf16") / dst.flops("bf16"),
        )


def scale_coefs(base: HardwareCoefs, r: Ratios) -> HardwareCoefs:
    """``base`` moved to other hardware by the ratios ``r`` (rules in the module docstring)."""
    weights, cache = r.mem * r.dense_bytes, r.mem * r.kv_bytes
    prefill = {
        k: c.model_copy(
            update={
                "a": c.a * weights,
                "b": c.b * r.dense,
                "c": c.c * r.attn,
                "d": c.d * r.attn,
                "e": c.e * cache,
                "f": c.f * weights,
            }
        )
        for k, c in base.prefill.items()
    }
    decode = {
        k: c.model_copy(
            update={
                "w": c.w * weights,
                "b": c.b * r.dense,
                "steps": tuple(x * r.dense for x in c.steps),
                "c": c.c * cache,
                "h": c.h * cache,
                "q": c.q * r.attn,
                "d": c.d * r.mem,
                "e": c.e * r.attn,
            }
        )
        for k, c in base.decode.items()
    }

    def routed(m: MoeCoef) -> MoeCoef:  # e, f by their own resource; k (how they combine) kept
        return m.model_copy(update={"e": m.e * r.mem * r.expert_bytes, "f": m.f * r.expert})

    alone = base.moe_experts
    vis = base.vision_seconds_per_image
    return base.model_copy(
        update={
            "prefill": prefill,
            "decode": decode,
            "moe": routed(base.moe),
            "moe_experts": None if alone is None else routed(alone),
            "vision_seconds_per_image": None if vis is None else vis * r.vision,
        }
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
