"""Precision rules: how a fit measured in one dtype is used for a model in another.

Precision is data: a model file states the dtypes of its tensors (``Precision``), a hardware file
the rate of each tensor-core class, and a calibration profile the dtypes its kernels ran in
(``Dtypes``). Where a model's dtypes differ from those its profile's coefficients are in, the
coefficients move to the model's dtypes by ONE rule, :func:`dtype_rule`, class by class, and the
rule says what it did and what it rests on — never silently the measured numbers:

==============  ====================  ==========================  ===================  =========
class           measured -> model     hardware                    GEMM rows / reads    source
==============  ====================  ==========================  ===================  =========
dense, experts  the same dtype        any                         x 1 / x 1            measured
dense, experts  FP8 <-> BF16          units for both (all here)   rate / bytes ratio   datasheet
dense, experts  -> FP4 (MX, NV)       FP4 units (SM100, 950)      rate / bytes ratio   datasheet
dense, experts  -> FP4 (MX, NV)       no FP4 units (Hopper)       FP8 rate / bytes     guess
KV cache        any -> any            any                         as measured / bytes  guess
dense, experts  FP32, or unknown      any                         refused (ConfigError)
==============  ====================  ==========================  ===================  =========

"rate ratio" is the hardware file's dense rate of the measured dtype's class over the model's
(`HardwareSpec.flops`); the profiles hold no measurement in a second dtype, so FP8 ↔ BF16 on the
H200, which runs both, is the datasheet ratio too (the kernel table's measured GEMM rates,
1,416 and 756 TFLOP/s, give 1.87 where the datasheet gives 2.0: the rule says "datasheet").
Without units for the model's class (FP4 on Hopper) the GEMMs run at the next wider unit the
hardware has (`HardwareSpec.flops`: FP8) and the weights still read as their own, fewer bytes —
what a kernel that loads packed FP4 weights and converts them in registers does; no such kernel
was measured here, so that rule says it is a guess. A KV cache in another dtype changes the bytes
of its reads; the attention math is taken as measured (a guess too: an FP8-cache kernel is
another kernel). What no hardware file rates (FP32 GEMMs) or no table sizes is refused.

Which coefficient a factor moves is :func:`scale_coefs`'s table (shared with
``calibration/derive.py``, which moves a profile to other hardware by the same ratios):

================  ================================================  ==========================
coefficient       work                                              scaled by
================  ================================================  ==========================
prefill a         weight reads, launches                            mem × dense_bytes
prefill b         dense GEMMs per token                             dense
prefill c, d      indexer and attention (n·p, n²)                   attn
prefill e         per chunk, the prefix's cached entries (p)        mem × kv_bytes
prefill f         per chunk with a prefix: its extra kernels        mem × dense_bytes (as a)
prefill g         per new token of a chunk with a prefix (merge)    mem
prefill waves     query tiles run at once (SMs ÷ heads)             × SM count ratio, where
                                                                    both files state it; else kept
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

A dtype rule is that table on one hardware (mem = attn = vision = 1). What dtypes a profile's
coefficients are in (:func:`fitted_dtypes`): a measured profile's as measured; a derived one's as
``derive.py`` left them — the bundled model's own dtype where the target has units for it
(:func:`target_dtype`), else the measured one (so MXFP4 experts derived to an H800 are FP8
coefficients, and this rule then reads them as MXFP4 bytes at the FP8 rate, as on an H200).
The CSA indexer's keys are not a class here: the profiles record no indexer-key dtype (they were
timed in bf16), and a model's ``kv_indexer`` changes no coefficient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigError
from .hardware import HardwareSpec
from .profile import Dtypes, HardwareCoefs, MoeCoef
from .spec import DTYPE_BYTES, Precision, compute_class, dtype_bytes

if TYPE_CHECKING:
    from .profile import Profile
    from .spec import ModelSpec

__all__ = [
    "ClassRule",
    "DtypeRule",
    "Ratios",
    "dtype_rule",
    "fitted_dtypes",
    "profile_coefs",
    "scale_coefs",
    "target_dtype",
]

Source = Literal["measured", "datasheet", "guess"]


def target_dtype(model_dtype: str, measured_dtype: str, hw: HardwareSpec) -> str:
    """The dtype a model's ``model_dtype`` tensors run in on ``hw`` when a profile is derived for
    it: its own where ``hw`` has tensor units for it, else the dtype they were measured in."""
    cls = compute_class(model_dtype)
    if cls in ("fp4", "fp8", "int8") and getattr(hw.flops_per_s, cls) is None:
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
    sms: float = 1.0  # target SMs / source SMs (1 where a hardware file states none)

    @classmethod
    def of(cls, src: HardwareSpec, dst: HardwareSpec, measured: Dtypes, model: Precision) -> Ratios:
        """``src`` measured in ``measured`` to ``dst`` in the model's dtypes where ``dst`` has
        units for them (:func:`target_dtype`): what ``calibration/derive.py`` scales by."""

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
            sms=dst.sm_count / src.sm_count if dst.sm_count and src.sm_count else 1.0,
        )


def scale_coefs(base: HardwareCoefs, r: Ratios) -> HardwareCoefs:
    """``base`` moved by the ratios ``r`` (the table in the module docstring)."""
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
                "g": c.g * r.mem,
                "wave_tiles": c.wave_tiles * r.sms,
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


# ---- the rule ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassRule:
    """How one class of tensors moves from the dtype measured to the model's: ``rate`` multiplies
    the coefficients its GEMM rows bound, ``bytes`` those its reads bound (time factors, target
    over measured); ``text`` says so in a sentence, with its source."""

    what: Literal["dense layers", "experts", "KV cache"]
    measured: str
    model: str
    rate: float
    bytes: float
    source: Source
    text: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "class": self.what,
            "measured": self.measured,
            "model": self.model,
            "rate_factor": self.rate,
            "bytes_factor": self.bytes,
            "source": self.source,
        }


@dataclass(frozen=True)
class DtypeRule:
    """The rule that moves a profile's coefficients on ``hardware`` from the dtypes they are in
    to a model's: one :class:`ClassRule` per class whose dtype differs (none: the identity)."""

    hardware: str
    profile: str
    derived: bool
    classes: tuple[ClassRule, ...]

    @property
    def identity(self) -> bool:
        return not self.classes

    @property
    def guess(self) -> bool:
        return any(c.source == "guess" for c in self.classes)

    def _factor(self, what: str, which: str) -> float:
        for c in self.classes:
            if c.what == what:
                return float(getattr(c, which))
        return 1.0

    @property
    def ratios(self) -> Ratios:
        """The rule as :func:`scale_coefs`'s ratios, on one hardware (mem = attn = vision = 1)."""
        return Ratios(
            mem=1.0,
            dense=self._factor("dense layers", "rate"),
            dense_bytes=self._factor("dense layers", "bytes"),
            expert=self._factor("experts", "rate"),
            expert_bytes=self._factor("experts", "bytes"),
            attn=1.0,
            kv_bytes=self._factor("KV cache", "bytes"),
            vision=1.0,
        )

    def apply(self, coefs: HardwareCoefs) -> HardwareCoefs:
        """``coefs`` in the model's dtypes (the very same object under the identity)."""
        return coefs if self.identity else scale_coefs(coefs, self.ratios)

    @property
    def description(self) -> str:
        """One line: what the profile holds, then each class's move and its source."""
        if self.identity:
            return f"profile {self.profile}: the model's own dtypes"
        held = [f"{_name(c.measured)} {c.what}" for c in self.classes]
        verb = "(derived) holds" if self.derived else "measured"
        return f"profile {self.profile} {verb} {_and(held)}; " + "; ".join(
            c.text for c in self.classes
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "hardware": self.hardware,
            "rule": self.description,
            "guess": self.guess,
            "classes": [c.as_dict() for c in self.classes],
        }


def _name(dtype: str) -> str:
    return dtype.upper()


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _x(f: float) -> str:
    return f"{f:.2f}x"


def _refuse(what: str, dtype: str, why: str, model_name: str, profile: str, measured: str) -> None:
    raise ConfigError(
        "",
        f"model {model_name} has {_name(dtype)} {what} but profile {profile!r} holds its "
        f"{what} in {_name(measured)}, and no rule moves that fit to {_name(dtype)} ({why}): "
        f"calibrate the model in its own dtypes, or use the roofline cost model",
    )


def _weights(
    what: Literal["dense layers", "experts"],
    measured: str,
    model: str,
    hw: HardwareSpec,
    model_name: str,
    profile: str,
) -> ClassRule:
    for d in (measured, model):
        if d not in DTYPE_BYTES:
            _refuse(
                what, model, f"{d!r} is no dtype the simulator knows", model_name, profile, measured
            )
        if d == "fp32":
            _refuse(
                what,
                model,
                "no hardware file states an FP32 GEMM rate",
                model_name,
                profile,
                measured,
            )
    m_cls, d_cls = compute_class(measured), compute_class(model)
    b = dtype_bytes(model) / dtype_bytes(measured)
    r = hw.flops(m_cls) / hw.flops(d_cls)
    head = f"{_name(model)} {what} scaled by HBM bytes ({_x(b)})"
    units = d_cls == "bf16" or getattr(hw.flops_per_s, d_cls) is not None
    source: Source
    if not units:
        wider = {"fp4": ("fp8", "bf16"), "fp8": ("bf16",), "int8": ("fp8", "bf16")}[d_cls]
        runs_at = next(c for c in wider if c == "bf16" or getattr(hw.flops_per_s, c) is not None)
        rate = f"the {_name(runs_at)} rate" + ("" if r == 1.0 else f" ({_x(r)})")
        text = (
            f"{head} and {rate} (no {_name(d_cls)} units on {hw.name}; a guess, not measured: "
            f"{_name(model)} weights read packed, computed in {_name(runs_at)})"
        )
        source = "guess"
    elif m_cls == d_cls:
        text = f"{head} at the same {_name(d_cls)} rate (not measured)"
        source = "datasheet"
    else:
        text = (
            f"{head} and the {_name(d_cls)} rate ({_x(r)}, {hw.name} datasheet {_name(m_cls)}/"
            f"{_name(d_cls)}; no {_name(model)} measurement)"
        )
        source = "datasheet"
    return ClassRule(what, measured, model, r, b, source, text)


def _kv(measured: str, model: str, model_name: str, profile: str) -> ClassRule:
    for d in (measured, model):
        if d not in DTYPE_BYTES:
            _refuse(
                "KV cache",
                model,
                f"{d!r} is no dtype the simulator knows",
                model_name,
                profile,
                measured,
            )
    b = dtype_bytes(model) / dtype_bytes(measured)
    text = (
        f"{_name(model)} KV cache scaled by bytes on its reads ({_x(b)}), attention as "
        f"measured (a guess, not measured)"
    )
    return ClassRule("KV cache", measured, model, 1.0, b, "guess", text)


def dtype_rule(
    measured: Dtypes,
    model: Precision,
    hw: HardwareSpec,
    *,
    profile: str = "the profile",
    model_name: str = "the model",
    derived: bool = False,
) -> DtypeRule:
    """The rule that moves coefficients in the ``measured`` dtypes to the ``model``'s on ``hw``
    (the module docstring's table), or one ConfigError naming the model, the dtype and the profile
    when none applies. Model dtypes equal to the measured ones give the identity."""
    classes: list[ClassRule] = []
    if model.dense != measured.dense:
        classes.append(
            _weights("dense layers", measured.dense, model.dense, hw, model_name, profile)
        )
    if model.experts != measured.experts:
        classes.append(
            _weights("experts", measured.experts, model.experts, hw, model_name, profile)
        )
    if model.kv_main != measured.kv_cache:
        classes.append(_kv(measured.kv_cache, model.kv_main, model_name, profile))
    return DtypeRule(hw.name, profile, derived, tuple(classes))


# ---- a profile's coefficients in a model's dtypes ------------------------------------------------


def _entry_dtypes(profile: Profile, name: str, hw: HardwareSpec) -> Dtypes:
    fits = profile.models[name]
    d = fits.dtypes
    if profile.provenance.kind != "derived":
        return d
    from .registry import load_model

    try:
        own = load_model(name).precision  # what derive.py scaled this entry to
    except ConfigError:
        raise ConfigError(
            "",
            f"profile {profile.name!r} is derived, but its entry {name!r} is no bundled model: "
            "the dtypes its coefficients were derived to are unknown (derive.py derives bundled "
            "models only)",
        ) from None
    return Dtypes(
        dense=target_dtype(own.dense, d.dense, hw),
        experts=target_dtype(own.experts, d.experts, hw),
        attention=d.attention,
        kv_cache=target_dtype(own.kv_main, d.kv_cache, hw),
    )


def fitted_dtypes(profile: Profile, spec: ModelSpec, hw: HardwareSpec) -> Dtypes:
    """The dtypes ``profile``'s coefficients for ``spec`` on ``hw`` are in (module docstring)."""
    try:
        fits = profile.for_model(spec)
        names = [n for n, f in profile.models.items() if f is fits]
    except ConfigError:  # covered by two entries (blocks and experts), or none: all of them
        pair = profile.combined_entries(spec, hw.name)
        names = (
            list(pair) if pair else [n for n, f in profile.models.items() if hw.name in f.hardware]
        )
    found: list[Dtypes] = []
    for n in names:
        d = _entry_dtypes(profile, n, hw)
        if d not in found:
            found.append(d)
    if len(found) != 1:
        raise ConfigError(
            "",
            f"profile {profile.name!r}: the entries that cover model {spec.name} on {hw.name} "
            f"({', '.join(names)}) hold different dtypes, so no one rule moves them to the model's",
        )
    return found[0]


def profile_coefs(
    profile: Profile, spec: ModelSpec, hw: HardwareSpec
) -> tuple[HardwareCoefs, DtypeRule]:
    """``profile``'s coefficients for ``spec`` on ``hw`` in the model's own dtypes, and the rule
    that put them there (:func:`dtype_rule`; the stored coefficients under the identity)."""
    coefs = profile.coefs(spec, hw.name)
    rule = dtype_rule(
        fitted_dtypes(profile, spec, hw),
        spec.precision,
        hw,
        profile=profile.name,
        model_name=spec.name,
        derived=profile.provenance.kind == "derived",
    )
    return rule.apply(coefs), rule
