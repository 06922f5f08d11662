"""Calibration profiles: fitted step-cost models, per model, on named hardware.

A profile is a YAML file. Its header (``provenance``) says where the numbers come from: the
device, kernel backend and software they were measured with, or the profile they were derived
from and how. Its body holds fits **per model** (``models[name]``, a :class:`ModelFits`): the
precisions the kernels ran in, and per hardware name the fitted coefficients of each component,
each per *layer* so that the simulator composes a whole model from its layer counts:

- ``prefill[kind]``  t(n, p) = a + b·n + c·W(n)·p + d·n² + e·p     one attention block + shared
                              + [p > 0]·(f + g·n)                    expert
                     n new tokens of one sequence after a computed prefix of p tokens;
                     W(n) = n, or with ``wave_tiles`` n counted in whole waves of the attention
                     kernel's query tiles (:func:`wave_rows`)
- ``decode[kind]``   t = a + max(w, g(⌈T/τ⌉)) + c·K + d·B + e·v·K + h·K/B + q·T
                     one attention block: B sequences, v verify tokens each, T = B·v query
                     tokens, K context tokens
                     in total; τ the GEMM row tile (τ = 1: no tiling, ⌈⌉ dropped); g(k) the
                     GEMMs' cost of k row tiles: ``steps[k-1]`` (a measured staircase) up to
                     its length, b·τ·k beyond it or without one
- ``moe``            t = a + ((e·E_act)^k + (f·rows)^k)^(1/k)   routed experts of one rank
                     ``form: exp``   rows = R
                     ``form: tile``  rows = τ·E_act·⌈R/(E_act·τ)⌉
                     E local experts, R routed token-expert pairs, E_act = E·(1 − exp(−R/E));
                     k = 1 (the default): t = a + e·E_act + f·rows, weight reads and GEMMs add
                     up; k > 1: they overlap (their max as k → ∞)
- ``a2a``            latency and link efficiency of EP dispatch/combine (per MoE layer)
- ``vision``         seconds per image of the encoder

plus the raw measurements (grid and off-grid points) and the fit errors: training MAPE on the
grid, and MAPE on a separate set of off-grid shapes (between and beyond the grid points) that the
fits never saw. A measured profile carries one hardware entry per model; derived profiles carry
one per target hardware.

Which fits a model uses (:meth:`Profile.for_model`): its own, else those of a fitted model with
the very same layer widths (``deepseek-v4.1-flash-mini``, the engine core's 3-layer stack, uses
the ``deepseek-v4.1-flash`` fits: a fit is per layer, so depth does not matter).

Schema history: version 1 files (one model, ``model_family`` + top-level ``hardware``, ``fit``,
``raw``, ``dtypes``; held-out fit errors) still load: they are converted on reading. New
coefficient terms default to zero / no tiling / k = 1, which is exactly the version 1 forms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from ..errors import ConfigError, UserError
from ..validation import FrozenModel, load_yaml_model

if TYPE_CHECKING:
    from .spec import ModelSpec

Kind = Literal["csa", "hca", "swa", "mla"]
SCHEMA_VERSION: Literal[2] = 2
DECODE_TILES = (1, 16, 32, 64, 128)  # GEMM row tiles a decode fit may choose
MOE_TILES = (64, 128)  # tile rows of the MoE tile form (the exp form is its τ = 1 limit)


class FitError(FrozenModel):
    """Mean absolute percentage error of a fit: on the grid points it was trained on, and on the
    off-grid points it never saw (the number a calibration is judged by)."""

    train_mape: float = Field(ge=0)
    offgrid_mape: float | None = Field(None, ge=0, description="None: no off-grid points")
    offgrid_max_ape: float | None = Field(None, ge=0)
    n_train: int = Field(ge=0)
    n_offgrid: int = Field(0, ge=0)
    # version 1 profiles: a random 20 % hold-out inside the grid
    heldout_mape: float | None = Field(None, ge=0)
    heldout_max_ape: float | None = Field(None, ge=0)
    n_heldout: int | None = Field(None, ge=0)


class PrefillCoef(FrozenModel):
    a: float
    b: float
    c: float
    d: float
    e: float = Field(0.0, ge=0, description="per chunk per prefix token (independent of n)")
    f: float = Field(
        0.0, ge=0, description="per chunk that has a prefix (the prefix-only kernels' fixed cost)"
    )
    g: float = Field(
        0.0,
        ge=0,
        description="per new token of a chunk that has a prefix (an attention split in two "
        "calls, over the chunk and over the prefix, merges their outputs per token)",
    )
    wave_tile: int = Field(1, ge=1, description="query rows per tile of the prefix attention")
    wave_tiles: float = Field(
        0.0,
        ge=0,
        description="query tiles the GPU runs at once (its SMs over the heads): the n of the n·p "
        "term counts whole waves (wave_rows); 0: n as is",
    )


def wave_rows(n: Any, tile: int, tiles: float) -> Any:
    """New tokens as an attention kernel over a prefix pays for them: each head's query rows
    run in tiles of ``tile``, ``tiles`` tiles at once (one per SM), and every tile reads the
    whole prefix, so a chunk costs whole waves of ``tile · tiles`` rows (``tiles`` 0: n as it
    is). A TP8 slice of V3 on an H200 (16 heads, 132 SMs) runs 8.25 tiles of 128 rows per wave:
    a 1,024-token chunk fills one wave, 1,100 tokens take two. A number in, a float out (the
    simulator's per-chunk path, without numpy's scalar dispatch); an array in, an array out."""
    if tiles <= 0:
        return n
    if not isinstance(n, np.ndarray):
        return tile * tiles * math.ceil(math.ceil(n / tile) / tiles)
    return tile * tiles * np.ceil(np.ceil(n.astype(float) / tile) / tiles)


def gemm_cost(tokens: np.ndarray, b: float, tile: int, steps: np.ndarray) -> np.ndarray:
    """Decode GEMM cost of ``tokens`` query rows: ``steps[k-1]`` for k = ⌈tokens/tile⌉ row
    tiles up to the table's length (0 for no rows), b·tile·k beyond it or without a table
    (tile 1: b·tokens, not rounded). Array in, array out: the simulator's decode hot path calls
    it once per step and layer kind with a table converted once."""
    t = np.asarray(tokens, dtype=float)
    if tile == 1:
        return b * t
    k = np.ceil(t / tile)
    linear = b * tile * k
    n = steps.size
    if not n:
        return linear
    row = np.maximum(k, 1.0)  # np.clip's Python wrapper costs more than the two ufuncs
    np.minimum(row, n, out=row)
    table = steps[row.astype(np.int64) - 1]
    return np.where(k <= n, np.where(k < 1, 0.0, table), linear)


def tiled_verify(verify: Any, verify_tile: int) -> Any:
    """Verify tokens per sequence as the attention kernel pays for them: rounded up to whole
    tiles of ``verify_tile`` tokens (1: as they are)."""
    if verify_tile == 1:
        return verify
    return np.ceil(np.asarray(verify, dtype=float) / verify_tile) * verify_tile


class DecodeCoef(FrozenModel):
    a: float
    w: float = Field(ge=0)
    b: float = Field(ge=0)
    c: float
    d: float
    e: float = Field(0.0, ge=0, description="per query token per context token")
    h: float = Field(
        0.0, ge=0, description="per context token of the mean sequence (per-sequence scans)"
    )
    q: float = Field(
        0.0, ge=0, description="per query token outside the GEMMs (attention over fixed top-k)"
    )
    tile: int = Field(1, ge=1, description="GEMM row tile τ (1: T is not rounded up)")
    steps: tuple[float, ...] = Field(
        (),
        description="measured GEMM cost of k = 1, 2, ... row tiles (s), non-decreasing; "
        "replaces b·τ·k up to len(steps) tiles, b·τ·k beyond (empty: b·τ·k throughout)",
    )
    verify_tile: int = Field(
        1,
        ge=1,
        description="verify tokens one query-row tile of the attention kernel holds: the "
        "context term e·v·K counts v rounded up to whole tiles (FlashMLA's dense decode runs "
        "64 query rows per tile, so a TP8 slice of V3 with 16 heads pays for 4 tokens at once); "
        "1: every verify token",
    )

    @model_validator(mode="after")
    def _steps(self) -> DecodeCoef:
        if any(x < 0 for x in self.steps) or any(
            b < a for a, b in zip(self.steps, self.steps[1:], strict=False)
        ):
            raise ValueError("steps must be non-negative and non-decreasing")
        if self.steps and self.tile == 1:
            raise ValueError("a steps table needs a row tile > 1")
        return self

    def gemm_s(self, tokens: np.ndarray) -> np.ndarray:
        """The GEMM term's cost of ``tokens`` query rows (before the max with ``w``)."""
        return gemm_cost(tokens, self.b, self.tile, np.asarray(self.steps, dtype=float))

    def seconds(self, batch: np.ndarray, kv_tokens: np.ndarray, verify: float | np.ndarray):
        """One layer's decode step: ``batch`` sequences of ``verify`` query tokens each over
        ``kv_tokens`` context tokens in all (arrays broadcast)."""
        B = np.asarray(batch, dtype=float)
        K = np.asarray(kv_tokens, dtype=float)
        ctx = np.divide(K, B, out=np.zeros_like(K * B), where=B > 0)
        t = self.a + np.maximum(self.w, self.gemm_s(B * verify)) + self.c * K + self.d * B
        return (
            t
            + self.e * tiled_verify(verify, self.verify_tile) * K
            + self.h * ctx
            + self.q * B * verify
        )


class MoeCoef(FrozenModel):
    a: float
    e: float = Field(ge=0)
    f: float = Field(ge=0)
    form: Literal["exp", "tile"] = "exp"
    tile: int = Field(1, ge=1, description="rows per expert tile of the tile form")
    k: float = Field(
        1.0,
        ge=1.0,
        description="exponent combining the active experts' weight reads w = e·E_act and the "
        "GEMMs g = f·rows as (w^k + g^k)^(1/k): 1, they add up (the additive form); larger, "
        "they overlap (→ max(w, g) as k grows)",
    )

    @model_validator(mode="after")
    def _form_tile(self) -> MoeCoef:
        if self.form == "exp" and self.tile != 1:
            raise ValueError("the exp form has no tile (tile must be 1)")
        return self


class A2aCoef(FrozenModel):
    latency_s: float = Field(ge=0, description="per dispatch or combine, per MoE layer")
    link_efficiency: float = Field(gt=0, le=1.5, description="achieved / datasheet link bandwidth")
    measured: bool = Field(description="measured over NCCL between GPUs, or modelled")


class HostOverhead(FrozenModel):
    """Per layer call: what eager launching adds on top of the graphed GPU time (median)."""

    prefill: float = Field(0.0, ge=0)
    decode: float = Field(0.0, ge=0)
    moe: float = Field(0.0, ge=0)


class EngineOverhead(FrozenModel):
    """Host time of the engine core's own step (scheduling, decode plans, routing), fitted from
    timed ``EngineCore.execute`` steps minus the kernel models. Used only to compare with that
    engine (it is a property of our Python engine, not of the hardware)."""

    decode_step_s: float = Field(0.0, ge=0)
    decode_per_seq_s: float = Field(0.0, ge=0)
    decode_per_kv_token_s: float = Field(0.0, ge=0)
    prefill_step_s: float = Field(0.0, ge=0)
    prefill_per_seq_s: float = Field(0.0, ge=0)
    prefill_per_token_s: float = Field(0.0, ge=0)
    # eager prefill whose host work overlaps the GPU's: step = max(GPU model, host) + ρ·min(GPU
    # model, host) + loop, ρ the share of the shorter one left exposed; the host time of a step
    # is prefill_host_s + per prompt + per token (all 0: the additive form above)
    prefill_host_s: float = Field(0.0, ge=0)
    prefill_host_per_seq_s: float = Field(0.0, ge=0)
    prefill_host_per_token_s: float = Field(0.0, ge=0)
    prefill_host_exposed: float = Field(0.0, ge=0, le=1, description="ρ")
    # the replay loop's bookkeeping between two steps (admission, acceptance, slot upkeep)
    decode_loop_s: float = Field(0.0, ge=0)
    decode_loop_per_seq_s: float = Field(0.0, ge=0)
    prefill_loop_s: float = Field(0.0, ge=0)
    # a prefill step replayed as a CUDA graph (HardwareCoefs.engine_prefill_graph_tokens): the
    # graphed kernel models plus a constant, a cost per prompt (each prompt's own attention
    # calls, whose fixed GPU cost a one-prompt kernel fit counts once) and a cost per token (the
    # engine's work between the timed kernels: norms, residuals, routing, embedding). The
    # constant may be negative: the kernel fits' intercepts, timed one kernel at a time, count
    # fixed costs that consecutive kernels in one graph overlap
    prefill_graph_step_s: float = 0.0
    prefill_graph_per_seq_s: float = Field(0.0, ge=0)
    prefill_graph_per_token_s: float = Field(0.0, ge=0)
    # layers per layer group of the timed engine stack (calibration.sweep.engine_stack); the
    # replay check runs the engine at this depth
    stack_depth: int = Field(1, ge=1)


class HardwareCoefs(FrozenModel):
    prefill: dict[Kind, PrefillCoef]
    decode: dict[Kind, DecodeCoef]
    moe: MoeCoef
    moe_experts: MoeCoef | None = Field(
        None,
        description="the experts' own work alone (grouped GEMMs, SwiGLU): a rank's "
        "routed-expert time under expert parallelism, whose exchange sorts, quantizes, gathers "
        "and combines (``moe`` times those too: one rank alone). None: not measured",
    )
    a2a: A2aCoef
    vision_seconds_per_image: float | None = None
    graphed: bool = Field(
        False, description="fits are CUDA-graph replays (GPU time, no launch gaps)"
    )
    host_overhead_s: HostOverhead = Field(default_factory=lambda: HostOverhead())
    engine_overhead: EngineOverhead = Field(default_factory=lambda: EngineOverhead())
    engine_graphs: bool = Field(
        False,
        description="the timed engine core replayed its decode steps as CUDA graphs (no "
        "per-layer launch gaps in decode)",
    )
    engine_prefill_graph_tokens: int = Field(
        0,
        ge=0,
        description="... and its prefill-only steps of at most this many tokens (no launch gaps "
        "there; 0: every prefill step eager, its host launches in the engine model)",
    )


class Provenance(FrozenModel):
    kind: Literal["measured", "derived"]
    note: str = ""
    device: str | None = None
    kernels: str | None = Field(None, description="kernel backend measured (reference, deepseek)")
    kernel_versions: dict[str, str] = Field(default_factory=dict)
    torch: str | None = None
    cuda: str | None = None
    date: str | None = None
    command: str | None = None
    duration_s: float | None = None
    derived_from: str | None = None
    method: str | None = None


class Dtypes(FrozenModel):
    """Precisions the measured kernels ran in (derivation rescales from these to the model's).

    The defaults are the reference kernels on a GPU: FP8 projections and experts, attention
    computed in bf16 over a bf16 cache (``kernels/cache.py``)."""

    dense: str = "fp8"
    experts: str = "fp8"
    attention: str = Field("bf16", description="attention compute")
    kv_cache: str = Field("bf16", description="main KV cache storage")


class Widths(FrozenModel):
    """The layer widths a fit is valid at (a fit is per layer: depth and expert count may differ,
    widths may not)."""

    hidden: int
    expert_width: int
    top_k: int
    attention: dict[str, int]
    shared_expert_width: int | None = Field(
        None, description="None: expert_width (a tensor-parallel slice narrows it apart)"
    )

    @model_validator(mode="before")
    @classmethod
    def _defaults_of_newer_fields(cls, data: Any) -> Any:
        """Widths recorded before an attention field existed hold its default (so a profile
        still matches the models it was measured for)."""
        from .spec import Attention

        if isinstance(data, dict) and isinstance(data.get("attention"), dict):
            defaults = {
                k: f.default for k, f in Attention.model_fields.items() if not f.is_required()
            }
            data = {**data, "attention": {**defaults, **data["attention"]}}
        return data

    @classmethod
    def of(cls, spec: ModelSpec) -> Widths:
        return cls(
            hidden=spec.hidden,
            expert_width=spec.moe.expert_width,
            top_k=spec.moe.top_k,
            attention=spec.attention.model_dump(),
            shared_expert_width=spec.moe.shared_expert_width,
        )

    def of_layers(self) -> tuple[Any, ...]:
        """What the attention-block fits (attention, shared expert, dense layers) depend on."""
        shared = self.shared_expert_width or self.expert_width
        return (self.hidden, self.top_k, self.attention, shared)

    def of_experts(self) -> tuple[int, int, int]:
        """What the routed-expert fits depend on."""
        return (self.hidden, self.top_k, self.expert_width)


class ModelFits(FrozenModel):
    """What was measured for one model: dtypes, coefficients per hardware, fit errors, raw data."""

    dtypes: Dtypes = Dtypes()
    widths: Widths | None = Field(None, description="None: read the registry model of this name")
    hardware: dict[str, HardwareCoefs] = Field(min_length=1)
    fit: dict[str, FitError] = Field(default_factory=dict)
    raw: dict[str, list[list[float | str]]] = Field(default_factory=dict)

    def for_hardware(self, hw: str) -> HardwareCoefs:
        if hw not in self.hardware:
            raise ConfigError(
                "",
                f"no coefficients for hardware {hw!r} "
                f"(it covers {', '.join(sorted(self.hardware))})",
            )
        return self.hardware[hw]


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version 1 profile (one model) as version 2: ``models = {model_family: ...}``."""
    data = dict(data)
    family = data.pop("model_family")
    fits: dict[str, Any] = {"hardware": data.pop("hardware", {})}
    dtypes = data.pop("dtypes", None)
    if isinstance(dtypes, dict) and "kv_cache" not in dtypes:
        # version 1 kernels held their cache in the attention compute dtype
        dtypes = {**dtypes, "kv_cache": dtypes.get("attention", "bf16")}
    if dtypes is not None:
        fits["dtypes"] = dtypes
    for key in ("fit", "raw"):
        if key in data:
            fits[key] = data.pop(key)
    data["models"] = {family: fits}
    data["version"] = SCHEMA_VERSION
    return data


class Profile(FrozenModel):
    name: str
    version: Literal[2] = SCHEMA_VERSION
    provenance: Provenance
    models: dict[str, ModelFits] = Field(min_length=1, description="fits per model name")

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        if isinstance(data, dict) and "model_family" in data and "models" not in data:
            return _from_v1(data)
        return data

    def hardware_names(self) -> list[str]:
        return sorted({hw for fits in self.models.values() for hw in fits.hardware})

    def for_model(self, spec: ModelSpec) -> ModelFits:
        """The fits of ``spec``: its own, else a fitted model's with identical layer widths
        (entries that hold only routed-expert fits — expert-parallel slices — are not a
        model's fits: ``coefs`` combines them with another's blocks)."""
        own = self.models.get(spec.name)
        if own is not None and _has_blocks(own):
            return own
        want = Widths.of(spec)
        for name, fits in self.models.items():
            if _has_blocks(fits) and _widths(name, fits) == want:
                return fits
        base, sep, width = spec.name.partition("@")
        if sep:  # one GPU's slice under tensor parallelism: name the widths it was measured at
            measured = sorted(
                n.partition("@")[2] or "tp1"
                for n, f in self.models.items()
                if n.partition("@")[0] == base and _has_blocks(f)
            )
            raise ConfigError(
                "",
                f"profile {self.name!r} has no fits for {base} at {width} (one GPU's slice: "
                f"{spec.attention.heads} heads; it was measured at "
                f"{', '.join(measured) or 'no width of this model'}): calibrate the slice "
                f"(deepinfer-sim calibrate --model {spec.name} ...) and merge it in "
                "(deepinfer-sim merge-profiles), or use the roofline cost model",
            )
        raise ConfigError(
            "",
            f"profile {self.name!r} has no fits for model {spec.name!r} (it has fits for "
            f"{', '.join(sorted(self.models))}, none at {spec.name}'s widths): calibrate it "
            f"(deepinfer-sim calibrate --model {spec.name} ...) and merge the result in "
            "(deepinfer-sim merge-profiles), or use the roofline cost model",
        )

    def coefs(self, spec: ModelSpec, hw: str) -> HardwareCoefs:
        """The coefficients of ``spec`` on ``hw``, or one ConfigError saying which is missing.

        A model no entry matches at every width may still be covered by two: its attention
        blocks timed at its layer widths (a tensor-parallel slice) and its routed experts timed
        at its expert width (an expert-parallel slice, ``NAME@tp1-moetpM``): the block fits of
        the one, the routed-expert fits of the other."""
        try:
            fits = self.for_model(spec)
        except ConfigError:
            combined = self._combined(spec, hw)
            if combined is not None:
                return combined
            covered = self.hardware_names()
            if hw not in covered:
                raise ConfigError(
                    "",
                    f"profile {self.name!r} has no coefficients for hardware {hw!r} (it covers "
                    f"{', '.join(covered)}): derive them (deepinfer-sim derive-profile) or "
                    f"calibrate on a {hw}",
                ) from None
            raise
        if hw not in fits.hardware:
            raise ConfigError(
                "",
                f"profile {self.name!r} has fits for model {spec.name!r} but no coefficients "
                f"for hardware {hw!r} (it covers {', '.join(sorted(fits.hardware))}): derive "
                f"them (deepinfer-sim derive-profile) or calibrate on a {hw}",
            )
        return fits.hardware[hw]

    def _combined(self, spec: ModelSpec, hw: str) -> HardwareCoefs | None:
        """The block fits of an entry at ``spec``'s layer widths with the routed-expert fits of
        an entry at its expert width (both on ``hw``), or None."""
        names = self.combined_entries(spec, hw)
        if names is None:
            return None
        blocks, experts = (self.models[n].hardware[hw] for n in names)
        return blocks.model_copy(update={"moe": experts.moe, "moe_experts": experts.moe_experts})

    def combined_entries(self, spec: ModelSpec, hw: str) -> tuple[str, str] | None:
        """(the entry whose block fits, the entry whose routed-expert fits) cover ``spec`` on
        ``hw`` when no one entry does, or None."""
        want = Widths.of(spec)
        blocks = experts = None
        for name, fits in self.models.items():
            w = _widths(name, fits)
            if w is None or hw not in fits.hardware:
                continue
            if blocks is None and w.of_layers() == want.of_layers() and fits.hardware[hw].decode:
                blocks = name
            if experts is None and w.of_experts() == want.of_experts():
                experts = name
        return None if blocks is None or experts is None else (blocks, experts)

    def for_hardware(self, hw: str) -> HardwareCoefs:
        """The coefficients on ``hw`` of a profile with fits for ONE model (version 1 callers;
        use :meth:`coefs` with the model otherwise)."""
        if len(self.models) != 1:
            raise ConfigError(
                "",
                f"profile {self.name!r} has fits for {len(self.models)} models "
                f"({', '.join(sorted(self.models))}); name the model (Profile.coefs)",
            )
        (fits,) = self.models.values()
        if hw not in fits.hardware:
            raise ConfigError(
                "",
                f"profile {self.name!r} has no coefficients for hardware {hw!r} "
                f"(it covers {', '.join(sorted(fits.hardware))})",
            )
        return fits.hardware[hw]


def _has_blocks(fits: ModelFits) -> bool:
    """Whether an entry holds attention-block fits (not only routed experts')."""
    return any(c.decode for c in fits.hardware.values())


def _widths(name: str, fits: ModelFits) -> Widths | None:
    if fits.widths is not None:
        return fits.widths
    from .registry import load_model

    try:
        return Widths.of(load_model(name))
    except ConfigError:  # not a bundled model and no widths recorded: matches by name only
        return None


def merge_profiles(profiles: Iterable[Profile], name: str) -> Profile:
    """One profile holding the model fits of several (e.g. one calibration run per model).

    They must come from the same kind of provenance, device and kernel backend, and fit disjoint
    models. Software versions that differ are kept side by side (``a | b``)."""
    items = list(profiles)
    if not items:
        raise UserError("merge-profiles needs at least one profile")
    first = items[0].provenance
    models: dict[str, ModelFits] = {}
    for p in items:
        prov = p.provenance
        for field in ("kind", "device", "kernels"):
            if getattr(prov, field) != getattr(first, field):
                raise UserError(
                    f"cannot merge {items[0].name!r} and {p.name!r}: their {field} differs "
                    f"({getattr(first, field)!r} vs {getattr(prov, field)!r})"
                )
        for model, fits in p.models.items():
            if model in models:
                raise UserError(
                    f"cannot merge: model {model!r} has fits in more than one profile "
                    f"({', '.join(q.name for q in items if model in q.models)})"
                )
            models[model] = fits

    def joined(values: Iterable[str | None]) -> str | None:
        seen = list(dict.fromkeys(v for v in values if v))
        return " | ".join(seen) if seen else None

    provs = [p.provenance for p in items]
    keys = list(dict.fromkeys(k for q in provs for k in q.kernel_versions))
    durations = [q.duration_s for q in provs if q.duration_s is not None]
    merged = first.model_copy(
        update={
            "note": f"merged from {', '.join(p.name for p in items)}"
            + "".join(f"; {p.name}: {p.provenance.note}" for p in items if p.provenance.note),
            "kernel_versions": {
                k: joined(q.kernel_versions.get(k) for q in provs) or "" for k in keys
            },
            "torch": joined(q.torch for q in provs),
            "cuda": joined(q.cuda for q in provs),
            "date": max((q.date for q in provs if q.date), default=None),
            "command": joined(q.command for q in provs),
            "duration_s": round(sum(durations), 1) if durations else None,
            "derived_from": joined(q.derived_from for q in provs),
            "method": joined(q.method for q in provs),
        }
    )
    return Profile(name=name, provenance=merged, models=models)


def write_profile(profile: Profile, path: Path) -> None:
    """Write a profile as YAML (coefficients first, raw measurements last)."""
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False, width=110)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def profiles_dir() -> Path:
    from importlib import resources

    return Path(str(resources.files("deepinfer_sim.calibration") / "profiles"))


def available_profiles() -> list[str]:
    return sorted(p.stem for p in profiles_dir().glob("*.yaml"))


def resolve_profile(ref: str, base_dir: Path | None = None) -> Path:
    """A shipped profile name (``sm100-derived``) or a path to a profile YAML."""
    from .registry import resolve_yaml

    return resolve_yaml(ref, profiles_dir(), "cost profile", base_dir)


_CACHE: dict[tuple[Path, int, int], Profile] = {}


def load_profile(ref: str, base_dir: Path | None = None) -> Profile:
    path = resolve_profile(ref, base_dir).resolve()
    st = path.stat()
    key = (path, st.st_mtime_ns, st.st_size)  # a rewritten file is read again
    if key not in _CACHE:
        _CACHE[key] = load_yaml_model(Profile, path)
    return _CACHE[key]
