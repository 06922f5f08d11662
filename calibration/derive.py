"""Derive a profile for hardware that is not at hand from a measured one, by roofline ratios.

Each fitted coefficient is a time per unit of some work, and each kind of work is bound by one
resource, so a coefficient moves to other hardware by the ratio of that resource's rate:

- prefill a (weights read, launches): HBM bandwidth (BW_measured / BW_target)
- prefill b (dense GEMMs per token): dense-dtype tensor rate (F_measured / F_target)
- prefill c, d (indexer and attention): attention-dtype tensor rate
- decode a (launches, sync): not hardware-bound, kept
- decode w, c, d (weights, KV and per-sequence reads): HBM bandwidth
- decode b (dense GEMMs per token): dense-dtype tensor rate
- moe a: kept; moe e (expert weights read): HBM bandwidth × expert bytes per parameter
- moe f (expert GEMMs per routed pair): expert-dtype tensor rate, FP4 where the target has FP4
  units (the measured H200 ran them in FP8)
- vision seconds per image: bf16 tensor rate
- a2a latency and link efficiency: kept; the bandwidth comes from the target's links

The derived profile's header says "derived, not measured", from what and how. Re-running
``deepinfer-sim calibrate`` on the target hardware replaces it with a measurement.
"""

from __future__ import annotations

from ..models.hardware import HardwareSpec
from ..models.registry import load_hardware, load_model
from ..models.spec import compute_class, dtype_bytes
from .profile import DecodeCoef, HardwareCoefs, MoeCoef, PrefillCoef, Profile, Provenance

METHOD = (
    "derived, not measured: every coefficient of the measured profile scaled by the ratio of the "
    "resource that bounds it (dense/attention/expert tensor rate per dtype, HBM bandwidth, "
    "expert bytes per parameter); all-to-all latency and link efficiency kept, link bandwidth "
    "from the target hardware spec. See calibration/derive.py."
)


def scale_coefs(
    base: HardwareCoefs, src: HardwareSpec, dst: HardwareSpec, profile: Profile
) -> HardwareCoefs:
    model = load_model(profile.model_family)
    d = profile.dtypes
    mem = src.hbm_bytes_per_s / dst.hbm_bytes_per_s
    dense = src.flops(compute_class(d.dense)) / dst.flops(compute_class(model.precision.dense))
    attn = src.flops(compute_class(d.attention)) / dst.flops(compute_class(d.attention))
    # experts: measured in d.experts; the model ships them in precision.experts (MXFP4). On the
    # target they run at the FP4 rate where it has FP4 units (HardwareSpec.flops falls back).
    expert = src.flops(compute_class(d.experts)) / dst.flops(compute_class(model.precision.experts))
    expert_bytes = dtype_bytes(model.precision.experts) / dtype_bytes(d.experts)
    vision = src.flops("bf16") / dst.flops("bf16")
    prefill = {
        k: PrefillCoef(a=c.a * mem, b=c.b * dense, c=c.c * attn, d=c.d * attn)
        for k, c in base.prefill.items()
    }
    decode = {
        k: DecodeCoef(a=c.a, w=c.w * mem, b=c.b * dense, c=c.c * mem, d=c.d * mem)
        for k, c in base.decode.items()
    }
    m = base.moe
    moe = MoeCoef(a=m.a, e=m.e * mem * expert_bytes, f=m.f * expert)
    vis = base.vision_seconds_per_image
    return HardwareCoefs(
        prefill=prefill,
        decode=decode,
        moe=moe,
        a2a=base.a2a,
        vision_seconds_per_image=None if vis is None else vis * vision,
        graphed=base.graphed,
        host_overhead_s=base.host_overhead_s,
        engine_overhead=base.engine_overhead,
    )


def derive(measured: Profile, name: str, targets: list[str]) -> Profile:
    """A profile for ``targets`` (hardware names) derived from ``measured``'s only entry."""
    if measured.provenance.kind != "measured" or len(measured.hardware) != 1:
        raise ValueError("derive() needs a measured profile with one hardware entry")
    ((src_name, base),) = measured.hardware.items()
    src = load_hardware(src_name)
    return Profile(
        name=name,
        model_family=measured.model_family,
        provenance=Provenance(
            kind="derived",
            derived_from=measured.name,
            method=METHOD,
            note=f"measured on {measured.provenance.device} ({src_name}); targets "
            + ", ".join(targets),
            date=measured.provenance.date,
        ),
        dtypes=measured.dtypes,
        hardware={t: scale_coefs(base, src, load_hardware(t), measured) for t in targets},
        fit=measured.fit,
    )
