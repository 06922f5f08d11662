"""Calibration profiles: fitted step-cost models of one model family on named hardware.

A profile is a YAML file. Its header says where the numbers come from (the device and software
they were measured on, or the profile they were derived from and how); its body holds, per
hardware name, the fitted coefficients of four components, each per *layer* so that the
simulator composes a whole model from its layer counts:

- ``prefill[kind]``  t(n, p) = a + b·n + c·n·p + d·n²        one attention block + shared expert
                     n new tokens of one sequence after a computed prefix of p tokens
- ``decode[kind]``   t(B, T, K) = a + max(w, b·T) + c·K + d·B  one attention block, decode step
                     B sequences, T = B·v query tokens (v verify tokens each), K context tokens
- ``moe``            t(E, R) = a + e·E·(1 − exp(−R/E)) + f·R   routed experts of one rank, one layer
                     E local experts, R routed token-expert pairs
- ``a2a``            latency and link efficiency of EP dispatch/combine (per MoE layer)
- ``vision``         seconds per image of the encoder

plus the raw measurements and the held-out fit error. The measured profile carries one hardware
entry; derived profiles carry one entry per target hardware.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from ..errors import ConfigError
from ..validation import FrozenModel, load_yaml_model

Kind = Literal["csa", "hca", "swa", "mla"]


class FitError(FrozenModel):
    """Mean absolute percentage error of a fit on points used (train) and not used (held out)."""

    train_mape: float = Field(ge=0)
    heldout_mape: float = Field(ge=0)
    heldout_max_ape: float = Field(ge=0)
    n_train: int = Field(ge=0)
    n_heldout: int = Field(ge=0)


class PrefillCoef(FrozenModel):
    a: float
    b: float
    c: float
    d: float


class DecodeCoef(FrozenModel):
    a: float
    w: float = Field(ge=0)
    b: float = Field(ge=0)
    c: float
    d: float


class MoeCoef(FrozenModel):
    a: float
    e: float = Field(ge=0)
    f: float = Field(ge=0)


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


class HardwareCoefs(FrozenModel):
    prefill: dict[Kind, PrefillCoef]
    decode: dict[Kind, DecodeCoef]
    moe: MoeCoef
    a2a: A2aCoef
    vision_seconds_per_image: float | None = None
    graphed: bool = Field(
        False, description="fits are CUDA-graph replays (GPU time, no launch gaps)"
    )
    host_overhead_s: HostOverhead = Field(default_factory=lambda: HostOverhead())
    engine_overhead: EngineOverhead = Field(default_factory=lambda: EngineOverhead())


class Provenance(FrozenModel):
    kind: Literal["measured", "derived"]
    note: str = ""
    device: str | None = None
    torch: str | None = None
    cuda: str | None = None
    date: str | None = None
    command: str | None = None
    duration_s: float | None = None
    derived_from: str | None = None
    method: str | None = None


class Dtypes(FrozenModel):
    """Precisions the measured kernels ran in (derivation rescales from these)."""

    dense: str = "fp8"
    experts: str = "fp8"
    attention: str = "bf16"


class Profile(FrozenModel):
    name: str
    model_family: str = Field(description="model whose widths were measured")
    provenance: Provenance
    dtypes: Dtypes = Dtypes()
    hardware: dict[str, HardwareCoefs]
    fit: dict[str, FitError] = Field(default_factory=dict)
    raw: dict[str, list[list[float | str]]] = Field(default_factory=dict)

    def for_hardware(self, hw: str) -> HardwareCoefs:
        if hw not in self.hardware:
            raise ConfigError(
                "",
                f"profile {self.name!r} has no coefficients for hardware {hw!r} "
                f"(it covers {', '.join(sorted(self.hardware))})",
            )
        return self.hardware[hw]


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
    from ..models.registry import resolve_yaml

    return resolve_yaml(ref, profiles_dir(), "cost profile", base_dir)


_CACHE: dict[Path, Profile] = {}


def load_profile(ref: str, base_dir: Path | None = None) -> Profile:
    path = resolve_profile(ref, base_dir).resolve()
    if path not in _CACHE:
        _CACHE[path] = load_yaml_model(Profile, path)
    return _CACHE[path]
