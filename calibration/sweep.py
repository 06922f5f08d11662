"""The calibration sweep: time kernels over a grid of shapes, fit the models, write a profile.

The sweep is written against :class:`Bench`, a small timing interface that the GPU adapter in
``calibration/torch_bench.py`` implements with the real kernels of ``kernels/`` (and tests
implement with a synthetic clock). Grids (``quick`` finishes in a few minutes on an H200):

- prefill, per attention kind: n ∈ 256 .. 32,768 new tokens × p ∈ 0 .. 262,144 computed prefix;
- decode, per attention kind: B sequences × context length × v verify tokens (1 .. 6);
- routed experts: E local experts × R routed token-expert pairs;
- all-to-all: bytes per rank (measured between two GPUs when there are two, else modelled);
- the vision encoder: seconds per image.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Protocol

import numpy as np
from scipy.optimize import lsq_linear

from ..models.cost import StepParams
from .fit import fit_decode, fit_linear_latency, fit_moe, fit_prefill
from .profile import (
    A2aCoef,
    Dtypes,
    EngineOverhead,
    FitError,
    HardwareCoefs,
    HostOverhead,
    Profile,
    Provenance,
)


class Bench(Protocol):
    """Times one kernel call at a shape; returns median seconds."""

    device_name: str
    hardware: str  # the HardwareSpec name of the device (e.g. "h200")
    dtypes: Dtypes
    software: dict[str, str]

    def prefill(self, kind: str, n: int, p: int) -> float: ...
    def decode(self, kind: str, batch: int, context: int, verify: int) -> float: ...
    def moe(self, local_experts: int, tokens: int) -> float: ...
    def a2a_table(self) -> list[tuple[float, float]]: ...  # (bytes to a peer, s); [] on one GPU
    def copy_bandwidth(self) -> float: ...  # bytes/s, read + write counted
    def vision(self) -> float | None: ...

    host_overhead: dict[str, list[float]]  # eager − graphed seconds per call, by component

    def warmup(self) -> None: ...  # bring clocks up before timing

    def engine_steps(self) -> list[tuple[str, int, int, int, float]]:
        """Timed engine-core steps: (phase, sequences, tokens per sequence, context, seconds)."""
        ...


@dataclass(frozen=True)
class Grid:
    kinds: tuple[str, ...] = ("csa", "hca", "swa")
    prefill_n: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    prefill_p: tuple[int, ...] = (0, 4096, 16384, 65536, 131072, 262144)
    decode_b: tuple[int, ...] = (1, 4, 16, 32, 64, 128, 256)
    decode_ctx: tuple[int, ...] = (1024, 4096, 16384, 65536)
    decode_v: tuple[int, ...] = (1, 2, 4, 6)
    moe_e: tuple[int, ...] = (8, 24, 48, 100)
    moe_tokens: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384)
    max_decode_tokens: int = 4_000_000  # cap B × context (memory of the timed cache)

    @classmethod
    def quick(cls) -> Grid:
        return cls(
            prefill_n=(256, 1024, 4096, 8192, 16384, 32768),
            prefill_p=(0, 8192, 32768, 131072, 262144),
            decode_b=(1, 8, 32, 64, 128, 256),
            decode_ctx=(2048, 8192, 32768),
            decode_v=(1, 3, 6),
            moe_e=(8, 48, 100),
            moe_tokens=(16, 128, 1024, 4096, 16384),
        )


@dataclass
class Measurements:
    prefill: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    decode: dict[str, list[tuple[int, int, int, float]]] = field(default_factory=dict)
    moe: list[tuple[int, int, float]] = field(default_factory=list)
    a2a: list[tuple[float, float]] = field(default_factory=list)
    copy_bandwidth: float = 0.0
    vision: float | None = None
    engine: list[tuple[str, int, int, int, float]] = field(default_factory=list)
    seconds: float = 0.0


def _each(
    items: Iterable[Any], log: Callable[[str], None], what: str, fn: Callable[..., float]
) -> list[Any]:
    out = []
    for item in items:
        try:
            out.append((*item, fn(*item)))
        except Exception as exc:  # a shape that fails (e.g. out of memory) is logged and skipped
            log(f"  {what}{item}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
    return out


def measure(bench: Bench, grid: Grid, log: Callable[[str], None] = print) -> Measurements:
    t0 = time.perf_counter()
    m = Measurements()
    bench.warmup()
    for kind in grid.kinds:
        log(f"prefill {kind}")
        shapes = [(n, p) for n in grid.prefill_n for p in grid.prefill_p]
        m.prefill[kind] = _each(
            shapes, log, f"prefill {kind}", lambda n, p, k=kind: bench.prefill(k, n, p)
        )
        log(f"decode {kind}")
        shapes3 = [
            (b, c, v)
            for b in grid.decode_b
            for c in grid.decode_ctx
            for v in grid.decode_v
            if b * c <= grid.max_decode_tokens
        ]
        m.decode[kind] = _each(
            shapes3, log, f"decode {kind}", lambda b, c, v, k=kind: bench.decode(k, b, c, v)
        )
    log("moe")
    m.moe = _each([(e, t) for e in grid.moe_e for t in grid.moe_tokens], log, "moe", bench.moe)
    log("all-to-all")
    m.a2a = bench.a2a_table()
    m.copy_bandwidth = bench.copy_bandwidth()
    m.vision = bench.vision()
    log("engine steps")
    m.engine = bench.engine_steps()
    m.seconds = time.perf_counter() - t0
    return m


def build_profile(
    bench: Bench,
    m: Measurements,
    name: str,
    model_family: str,
    command: str,
    top_k: int,
) -> Profile:
    """Fit every component and assemble a measured profile with its raw data and fit errors."""
    from ..models.registry import load_hardware

    fits: dict[str, FitError] = {}
    prefill, decode = {}, {}
    raw: dict[str, list[list[float | str]]] = {"prefill": [], "decode": [], "moe": [], "a2a": []}
    for kind, rows in m.prefill.items():
        if len(rows) < 6:
            continue
        arr = np.array(rows, dtype=float)
        prefill[kind], fits[f"prefill.{kind}"] = fit_prefill(arr[:, :2], arr[:, 2])
        raw["prefill"] += [[kind, *map(float, r)] for r in rows]
    for kind, drows in m.decode.items():
        if len(drows) < 6:
            continue
        arr = np.array(drows, dtype=float)
        B, ctx, v, t = arr.T
        X = np.stack([B, B * v, B * ctx], axis=1)
        decode[kind], fits[f"decode.{kind}"] = fit_decode(X, t)
        raw["decode"] += [[kind, *map(float, r)] for r in drows]
    arr = np.array(m.moe, dtype=float)
    E, T, t = arr.T
    moe, fits["moe"] = fit_moe(np.stack([E, T * top_k], axis=1), t)
    raw["moe"] = [list(map(float, r)) for r in m.moe]
    hw = load_hardware(bench.hardware)
    if m.a2a:
        nb, ta = np.array(m.a2a, dtype=float).T
        latency, bw = fit_linear_latency(nb, ta)
        # one dispatch-or-combine exchange over the scale-up link between two GPUs
        a2a = A2aCoef(
            latency_s=latency,
            link_efficiency=min(1.5, bw / hw.scaleup.bytes_per_s_per_dir),
            measured=True,
        )
        raw["a2a"] = [list(map(float, r)) for r in m.a2a]
    else:
        # one GPU: model the link like the roofline does, at the efficiency HBM copies reach
        eff = min(1.0, m.copy_bandwidth / hw.hbm_bytes_per_s)
        a2a = A2aCoef(latency_s=hw.scaleup.latency_s, link_efficiency=eff, measured=False)
    over = {k: float(np.median(v)) for k, v in bench.host_overhead.items() if v}
    coefs = HardwareCoefs(
        prefill=prefill,
        decode=decode,
        moe=moe,
        a2a=a2a,
        vision_seconds_per_image=m.vision,
        graphed=bool(over),
        host_overhead_s=HostOverhead(**over),
    )
    if m.engine:
        coefs = coefs.model_copy(
            update={"engine_overhead": fit_engine_overhead(coefs, bench.hardware, m.engine)}
        )
        raw["engine"] = [list(r) for r in m.engine]
    return Profile(
        name=name,
        model_family=model_family,
        provenance=Provenance(
            kind="measured",
            device=bench.device_name,
            torch=bench.software.get("torch"),
            cuda=bench.software.get("cuda"),
            date=date.today().isoformat(),
            command=command,
            duration_s=round(m.seconds, 1),
            note=f"host {platform.node()}; copy bandwidth {m.copy_bandwidth / 1e12:.2f} TB/s",
        ),
        dtypes=bench.dtypes,
        hardware={bench.hardware: coefs},
        fit=fits,
        raw=raw,
    )


ENGINE_MODEL = "deepseek-v4.1-flash-mini"


def fit_engine_overhead(
    coefs: HardwareCoefs, hardware: str, rows: list[tuple[str, int, int, int, float]]
) -> EngineOverhead:
    """What the engine core's step costs beyond its kernels: residual = measured step − the
    eager kernel models, fitted (non-negative least squares) as a constant per step plus a cost
    per sequence plus a cost per token (prefill: prompt tokens; decode: context tokens)."""
    from ..models.cost import PoolShape
    from ..models.profile_cost import ProfileStepCost
    from ..models.registry import load_hardware, load_model

    cost = ProfileStepCost(
        load_model(ENGINE_MODEL),
        load_hardware(hardware),
        PoolShape(1, 0),
        coefs,
        StepParams(comm_overlap=0.0, step_overhead_s=0.0),
        eager=True,
    )
    fitted: dict[str, tuple[float, float, float]] = {}
    for phase in ("prefill", "decode"):
        sel = [r for r in rows if r[0] == phase]
        if len(sel) < 3:
            fitted[phase] = (0.0, 0.0, 0.0)
            continue
        feats, resid = [], []
        for _, b, n, ctx, t in sel:
            if phase == "decode":
                pred = cost.decode_step(np.array([float(b)]), np.array([float(b * ctx)]), 1.0)
                feats.append((1.0, b, b * ctx))
            else:
                pred = cost.prefill_step([[(n, 0)] * b])
                feats.append((1.0, b, b * n))
            resid.append(t - pred)
        F = np.array(feats, dtype=float)
        scale = F.max(axis=0)
        res = lsq_linear(F / scale, np.array(resid), bounds=(0, np.inf))
        a, s, k = (float(v) for v in res.x / scale)
        fitted[phase] = (a, s, k)
    return EngineOverhead(
        prefill_step_s=fitted["prefill"][0],
        prefill_per_seq_s=fitted["prefill"][1],
        prefill_per_token_s=fitted["prefill"][2],
        decode_step_s=fitted["decode"][0],
        decode_per_seq_s=fitted["decode"][1],
        decode_per_kv_token_s=fitted["decode"][2],
    )
