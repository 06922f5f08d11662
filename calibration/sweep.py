"""The calibration sweep: time kernels over a grid of shapes, fit the models, build a profile.

The sweep is written against :class:`Bench`, a small timing interface that the device adapter in
``calibration/torch_bench.py`` implements with a kernel backend of ``kernels/`` (and tests
implement with a synthetic clock). One bench measures ONE model, one layer at a time at its own
widths, for each of its distinct attention kinds:

- prefill, per kind: n new tokens × p computed prefix;
- decode, per kind: B sequences × context length × v verify tokens;
- routed experts: E local experts × T tokens (R = T·top_k routed pairs);
- all-to-all: bytes per rank (measured between two GPUs when there are two, else modelled);
- the vision encoder (seconds per image) and whole engine-core steps, both optional.

Every fit trains on all grid points. A separate **off-grid** set of shapes, between and beyond
the grid points (prefill n and p, decode B, context and v, MoE E and T), is timed too and decides
the reported error: it is what a simulation asks for, and where a form that only interpolates
the grid fails. Grids:

========  =====================================================================================
``full``  456 grid + 92 off-grid shapes for a 3-kind model (V4-Flash), tens of minutes on an H200
``quick`` 249 grid + 54 off-grid shapes for 3 kinds (171 + 38 for V4.1-Flash's CSA and HCA):
          the grid of the version 1 quick run plus 22 % off-grid, minutes per model on an H200
``tiny``  51 + 9 small shapes for the toy model of the CPU tests, a second (no vision)
========  =====================================================================================
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np
from scipy.optimize import least_squares, lsq_linear

from ..models.cost import StepParams
from ..models.profile import (
    A2aCoef,
    DecodeCoef,
    Dtypes,
    EngineOverhead,
    FitError,
    HardwareCoefs,
    HostOverhead,
    ModelFits,
    MoeCoef,
    PrefillCoef,
    Profile,
    Provenance,
    Widths,
)
from .fit import (
    PREFILL_FORMS,
    PrefillForm,
    fit_decode,
    fit_linear_latency,
    fit_moe,
    fit_prefill,
)

if TYPE_CHECKING:
    from ..models.spec import ModelSpec

EngineRow = tuple[str, int, int, int, float]  # (phase, sequences, tokens per sequence, ctx, s)


class Bench(Protocol):
    """Times one kernel call at a shape; returns median seconds."""

    device_name: str
    hardware: str  # the HardwareSpec name of the device (e.g. "h200")
    spec: ModelSpec  # the model measured (its widths)
    kernels: str  # kernel backend name
    software: dict[str, str]
    host_overhead: dict[str, list[float]]  # eager − graphed seconds per call, by component

    @property
    def kinds(self) -> Sequence[str]: ...  # the model's distinct attention kinds, each timed
    @property
    def dtypes(self) -> Dtypes: ...  # what the timed kernels ran in
    @property
    def kernel_versions(self) -> dict[str, str]: ...  # what the backend ran (after the sweep)
    @property
    def engine_graphs(self) -> bool: ...  # the engine core's decode steps are CUDA graphs
    @property
    def engine_prefill_graph_tokens(self) -> int: ...  # ... and prefill steps up to this size

    def prefill(self, kind: str, n: int, p: int) -> float: ...
    def decode(
        self, kind: str, batch: int, context: int, verify: int, spread: float = 0.0
    ) -> float: ...
    def moe(self, local_experts: int, tokens: int) -> float: ...
    def moe_experts(self, local_experts: int, tokens: int) -> float: ...  # GEMMs, SwiGLU only
    def a2a_table(self) -> list[tuple[float, float]]: ...  # (bytes to a peer, s); [] on one GPU
    def copy_bandwidth(self) -> float: ...  # bytes/s, read + write counted
    def vision(self) -> float | None: ...
    def warmup(self) -> None: ...  # bring clocks up before timing

    def engine_steps(
        self,
        decode: Sequence[tuple[int, int]],
        prefill: Sequence[tuple[int, int]],
        spread: float = 0.0,
        depth: int = 1,
    ) -> list[EngineRow]:
        """Timed engine-core steps of ``engine_stack(spec, depth=depth)``: decode (sequences,
        mean context, lengths spread by ``spread``) with one token each, prefill (sequences,
        prompt tokens) from an empty cache."""
        ...


class BenchSizes(TypedDict):
    """What ``TorchBench`` needs to time a grid: repeats and the sizes its caches must hold."""

    repeats: int
    max_prefix: int
    max_chunk: int
    max_batch: int
    max_context: int


@dataclass(frozen=True)
class Grid:
    name: str = "full"
    prefill_n: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
    prefill_p: tuple[int, ...] = (0, 4096, 16384, 65536, 131072, 262144)
    # chunk sizes between the powers of two (multiples of 128 and not), at no prefix and at one
    # prefix that is not a multiple of the HCA block: where kernel choices per size show
    prefill_line: tuple[int, ...] = ()
    prefill_line_p: tuple[int, ...] = (0, 24000)
    decode_b: tuple[int, ...] = (1, 4, 16, 32, 64, 128, 256)
    decode_ctx: tuple[int, ...] = (1024, 4096, 16384, 65536)
    decode_v: tuple[int, ...] = (1, 2, 4, 6)
    # the GEMM staircase: one decode shape per row count (B = rows / v) at one context
    decode_rows: tuple[int, ...] = tuple(128 * k for k in range(1, 13))
    decode_rows_ctx: int = 4096
    decode_rows_v: int = 4
    moe_e: tuple[int, ...] = (8, 24, 48, 100)
    moe_tokens: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384)
    max_decode_tokens: int = 4_000_000  # cap B × context (memory of the timed cache)
    # decode batches' context lengths spread over context · (1 ± spread), same total (0: uniform)
    decode_spread: float = 0.0
    # layers per layer group of the timed engine stack (deeper: more GPU work per step, so the
    # engine's host time is a smaller, steadier share of it)
    engine_depth: int = 1
    # off-grid validation shapes: (n, p), (B, context, v), (E, T)
    off_prefill: tuple[tuple[int, int], ...] = tuple(
        (n, p) for n in (768, 3000, 12000, 24000) for p in (2000, 50000, 180000, 400000)
    )
    off_decode: tuple[tuple[int, int, int], ...] = tuple(
        (b, c, v) for b in (24, 48, 96, 200) for c in (6000, 50000) for v in (3, 5)
    )
    off_moe: tuple[tuple[int, int], ...] = tuple(
        (e, t) for e in (16, 72) for t in (48, 512, 2500, 8000)
    )
    # engine-core steps: decode (sequences, context), prefill (sequences, prompt tokens)
    engine_decode: tuple[tuple[int, int], ...] = tuple(
        (b, c) for b in (1, 4, 16, 32, 64) for c in (1024, 4096, 8192)
    )
    # prefill steps from 16 tokens: one short prompt's step is common in serving, and a fit of
    # steps from 128 tokens up overestimated it by 6-11 % below that (issue 30)
    engine_prefill: tuple[tuple[int, int], ...] = tuple(
        (b, n)
        for n in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
        for b in (1, 2, 4)
        if n * b <= 16384 and (n >= 128 or b == 1)
    )
    vision: bool = True
    repeats: int = 7

    @classmethod
    def quick(cls) -> Grid:
        return cls(
            name="quick",
            prefill_n=(16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768),
            prefill_p=(0, 8192, 32768, 131072, 262144),
            prefill_line=(
                *(128 * k for k in (3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 18, 20, 22, 24)),
                1100,
                1700,
                2500,
            ),
            decode_b=(1, 8, 32, 64, 128, 256),
            decode_ctx=(2048, 8192, 16384, 32768, 65536),
            decode_v=(1, 2, 3, 4, 6),
            # 12-48 local experts at 128-300 rows each, where a fit without these points missed
            # by up to 14.5 % (issue 30): E 12 and 24, T 256 and 768
            moe_e=(4, 8, 12, 16, 24, 32, 48, 64, 100, 128),
            moe_tokens=(16, 64, 128, 256, 512, 768, 1024, 4096, 16384),
            # each n twice and each p twice, two of them beyond the grid's largest prefix
            off_prefill=(
                (768, 2000),
                (768, 180000),
                (3000, 50000),
                (3000, 400000),
                (12000, 2000),
                (12000, 180000),
                (24000, 50000),
                (24000, 400000),
                (1500, 20000),
                (5000, 0),
                (6000, 100000),
                (20000, 12000),
            ),
            # v = 5 (between 4 and 6), B between the grid's, contexts between and beyond
            off_decode=(
                (24, 6000, 5),
                (24, 50000, 5),
                (48, 6000, 5),
                (48, 50000, 5),
                (96, 6000, 5),
                (96, 20000, 5),
                (200, 6000, 5),
                (200, 12000, 5),
                (16, 3000, 5),
                (40, 24000, 5),
                (80, 3000, 5),
                (160, 24000, 5),
            ),
            off_moe=((20, 48), (20, 512), (20, 8000), (72, 48), (72, 2500), (72, 24000)),
        )

    @classmethod
    def tiny(cls) -> Grid:
        """Seconds on a CPU with a toy model (``tests/data/toy-model.yaml``): no vision."""
        return cls(
            name="tiny",
            prefill_n=(16, 64, 256),
            prefill_p=(0, 256, 1024),
            prefill_line=(48,),
            prefill_line_p=(0, 300),
            decode_b=(1, 4, 8),
            decode_ctx=(64, 512),
            decode_v=(1, 3),
            decode_rows=(4, 8, 12),
            decode_rows_ctx=64,
            decode_rows_v=2,
            moe_e=(2, 4, 8),
            moe_tokens=(8, 64, 256),
            off_prefill=((32, 500), (128, 2000)),
            off_decode=((2, 256, 2), (6, 1000, 2)),
            off_moe=((6, 32),),
            engine_decode=((1, 64), (4, 64), (4, 256)),
            engine_prefill=((1, 64), (2, 64), (1, 256)),
            vision=False,
            repeats=1,
        )

    @classmethod
    def named(cls, name: str) -> Grid:
        grids: dict[str, Callable[[], Grid]] = {"full": cls, "quick": cls.quick, "tiny": cls.tiny}
        if name not in grids:
            from ..errors import UserError

            raise UserError(f"unknown grid {name!r} (choose from {', '.join(grids)})")
        return grids[name]()

    # ---- shapes ---------------------------------------------------------------------------------
    def prefill_shapes(self) -> list[tuple[int, int]]:
        """The (n, p) grid, then the chunk-size line not already on it."""
        grid = [(n, p) for n in self.prefill_n for p in self.prefill_p]
        line = [(n, p) for n in self.prefill_line for p in self.prefill_line_p]
        return grid + [s for s in dict.fromkeys(line) if s not in grid]

    def decode_shapes(self) -> list[tuple[int, int, int]]:
        """The (B, context, v) grid, then the staircase line (rows = B·v) not already on it."""
        grid = [
            (b, c, v)
            for b in self.decode_b
            for c in self.decode_ctx
            for v in self.decode_v
            if b * c <= self.max_decode_tokens
        ]
        v, c = self.decode_rows_v, self.decode_rows_ctx
        line = [(-(-rows // v), c, v) for rows in self.decode_rows]
        return grid + [
            s for s in dict.fromkeys(line) if s not in grid and s[0] * c <= self.max_decode_tokens
        ]

    def moe_shapes(self) -> list[tuple[int, int]]:
        return [(e, t) for e in self.moe_e for t in self.moe_tokens]

    def offgrid_decode_shapes(self) -> list[tuple[int, int, int]]:
        return [(b, c, v) for b, c, v in self.off_decode if b * c <= self.max_decode_tokens]

    def count(self, kinds: int) -> dict[str, int]:
        """Shapes timed for a model of ``kinds`` attention kinds: grid and off-grid."""
        return {
            "grid": kinds * (len(self.prefill_shapes()) + len(self.decode_shapes()))
            + len(self.moe_shapes()),
            "offgrid": kinds * (len(self.off_prefill) + len(self.offgrid_decode_shapes()))
            + len(self.off_moe),
        }

    # ---- sizes the bench's caches must hold -----------------------------------------------------
    @property
    def max_prefix(self) -> int:
        return max(p for _, p in (*self.prefill_shapes(), *self.off_prefill))

    @property
    def max_chunk(self) -> int:
        return max(n for n, _ in (*self.prefill_shapes(), *self.off_prefill))

    @property
    def max_batch(self) -> int:
        return max(b for b, _, _ in (*self.decode_shapes(), *self.offgrid_decode_shapes()))

    @property
    def max_context(self) -> int:
        shapes = (*self.decode_shapes(), *self.offgrid_decode_shapes())
        return max(c + v for _, c, v in shapes)

    def bench_sizes(self) -> BenchSizes:
        """``TorchBench``'s repeats and cache sizes for timing this grid."""
        return BenchSizes(
            repeats=self.repeats,
            max_prefix=self.max_prefix,
            max_chunk=self.max_chunk,
            max_batch=self.max_batch,
            max_context=self.max_context,
        )


@dataclass
class Measurements:
    prefill: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    decode: dict[str, list[tuple[int, int, int, float]]] = field(default_factory=dict)
    moe: list[tuple[int, int, float]] = field(default_factory=list)
    prefill_off: dict[str, list[tuple[int, int, float]]] = field(default_factory=dict)
    decode_off: dict[str, list[tuple[int, int, int, float]]] = field(default_factory=dict)
    moe_off: list[tuple[int, int, float]] = field(default_factory=list)
    # the experts' own work alone (no routing sort, gather or combine): TorchBench.moe_experts
    moe_experts: list[tuple[int, int, float]] = field(default_factory=list)
    moe_experts_off: list[tuple[int, int, float]] = field(default_factory=list)
    a2a: list[tuple[float, float]] = field(default_factory=list)
    copy_bandwidth: float = 0.0
    vision: float | None = None
    engine: list[EngineRow] = field(default_factory=list)
    engine_depth: int = 1  # layers per group of the timed engine stack
    seconds: float = 0.0


def time_each(
    items: Iterable[Any], log: Callable[[str], None], what: str, fn: Callable[..., float]
) -> list[Any]:
    out = []
    for item in items:
        try:
            out.append((*item, fn(*item)))
        except Exception as exc:  # a shape that fails (e.g. out of memory) is logged and skipped
            log(f"  {what}{item}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
    return out


def time_prefill(
    bench: Bench, grid: Grid, kind: str, m: Measurements, log: Callable[[str], None]
) -> None:
    """``kind``'s prefill attention block on ``grid``'s prefill shapes and off-grid shapes, into
    ``m`` (shapes that fail are logged and skipped)."""

    def pre(n: int, p: int) -> float:
        return bench.prefill(kind, n, p)

    m.prefill[kind] = time_each(grid.prefill_shapes(), log, f"prefill {kind}", pre)
    m.prefill_off[kind] = time_each(grid.off_prefill, log, f"prefill {kind} off-grid", pre)


def time_decode(
    bench: Bench, grid: Grid, kind: str, m: Measurements, log: Callable[[str], None]
) -> None:
    """``kind``'s decode attention block on ``grid``'s decode shapes and off-grid shapes (batch,
    context, verify tokens; contexts spread by ``grid.decode_spread``), into ``m``."""

    def dec(b: int, c: int, v: int) -> float:
        return bench.decode(kind, b, c, v, grid.decode_spread)

    m.decode[kind] = time_each(grid.decode_shapes(), log, f"decode {kind}", dec)
    off = grid.offgrid_decode_shapes()
    m.decode_off[kind] = time_each(off, log, f"decode {kind} off-grid", dec)


def measure(
    bench: Bench,
    grid: Grid,
    log: Callable[[str], None] = print,
    checkpoint: Callable[[Measurements], None] | None = None,
) -> Measurements:
    """Time every grid and off-grid shape of ``bench``'s model (shapes that fail are logged and
    skipped), then the all-to-all, copy bandwidth, vision and engine steps. ``checkpoint`` gets
    the measurements so far after each part (a run cut short keeps what it timed)."""
    t0 = time.perf_counter()
    m = Measurements()
    save = checkpoint or (lambda _: None)
    bench.warmup()
    for kind in bench.kinds:
        log(f"prefill {kind}")
        time_prefill(bench, grid, kind, m, log)
        save(m)
        log(f"decode {kind}")
        time_decode(bench, grid, kind, m, log)
        save(m)
    log("moe")
    m.moe = time_each(grid.moe_shapes(), log, "moe", bench.moe)
    m.moe_off = time_each(grid.off_moe, log, "moe off-grid", bench.moe)
    log("moe, experts alone")
    m.moe_experts = time_each(grid.moe_shapes(), log, "moe experts", bench.moe_experts)
    m.moe_experts_off = time_each(grid.off_moe, log, "moe experts off-grid", bench.moe_experts)
    save(m)
    log("all-to-all")
    m.a2a = bench.a2a_table()
    m.copy_bandwidth = bench.copy_bandwidth()
    if grid.vision:
        m.vision = bench.vision()
    if grid.engine_decode or grid.engine_prefill:
        log("engine steps")
        m.engine = bench.engine_steps(
            grid.engine_decode,
            grid.engine_prefill,
            spread=grid.decode_spread,
            depth=grid.engine_depth,
        )
        m.engine_depth = grid.engine_depth
    m.seconds = time.perf_counter() - t0
    return m


def _decode_X(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, context, v, t) rows -> X = (B, T = B·v, K = B·context), t."""
    B, ctx, v, t = rows.T
    return np.stack([B, B * v, B * ctx], axis=1), t


def _arr(rows: Sequence[Sequence[float]], width: int) -> np.ndarray:
    return np.array(rows, dtype=float).reshape(-1, width)


def verify_tiles(spec: ModelSpec) -> dict[str, int]:
    """Per attention kind, the verify tokens one query tile of its decode kernel holds: V3's
    dense FlashMLA decode runs each KV head's query rows (verify tokens × query heads) in tiles
    of 64, so below 64 heads — a tensor-parallel slice — several tokens share a tile and cost
    what one does. V4's sparse kernels run 64 or 128 heads (a slice is padded up), one tile per
    token: 1."""
    heads = spec.attention.heads
    kinds = {g.attention for g in spec.layer_groups}
    return {"mla": max(1, 64 // heads)} if "mla" in kinds and heads < 64 else {}


def prefill_wave_tiles(spec: ModelSpec, hardware: str) -> float:
    """Query tiles of a prefill attention kernel the GPU runs at once: its SMs over the model's
    query heads per GPU (a slice's own); 0 where the hardware file states no SM count
    (``fit.fit_prefill`` then tries no wave form)."""
    from ..models.registry import load_hardware

    sms = load_hardware(hardware).sm_count
    return sms / spec.attention.heads if sms else 0.0


def fit_kernels(
    m: Measurements,
    top_k: int,
    prefill_forms: tuple[PrefillForm, ...] = PREFILL_FORMS,
    tiles_of_verify: dict[str, int] | None = None,
    wave_tiles: float = 0.0,
) -> tuple[dict[str, PrefillCoef], dict[str, DecodeCoef], MoeCoef, dict[str, FitError]]:
    """Every kernel fit (prefill and decode per attention kind, the routed experts) of the
    grid measurements in ``m``, scored on its off-grid ones. ``top_k``: the model's routed
    experts per token (a timed MoE call of T tokens over E experts routes T·min(top_k, E));
    ``prefill_forms``: the prefill forms cross-validation chooses from (``fit_prefill``);
    ``wave_tiles``: :func:`prefill_wave_tiles` of the model and device timed."""
    prefill, decode, fits = fit_attention(m, prefill_forms, tiles_of_verify, wave_tiles)
    moe, fits["moe"] = fit_routed(m, top_k)
    return prefill, decode, moe, fits


def fit_routed(m: Measurements, top_k: int, experts: bool = False) -> tuple[MoeCoef, FitError]:
    """The routed experts' fit of ``m`` (a timed call of T tokens over E experts routes
    T·min(top_k, E) pairs), scored on its off-grid shapes; ``experts``: of the experts' own
    work alone (``Measurements.moe_experts``)."""

    def moe_X(rows: Sequence[tuple[int, int, float]]) -> tuple[np.ndarray, np.ndarray]:
        pairs = [(e, tok * min(top_k, e), t) for e, tok, t in rows]
        E, R, t = _arr(pairs, 3).T
        return np.stack([E, R], axis=1), t

    grid, off = (m.moe_experts, m.moe_experts_off) if experts else (m.moe, m.moe_off)
    if len(grid) < 4:
        raise RuntimeError(f"only {len(grid)} routed-expert shapes could be timed")
    X, t = moe_X(grid)
    Xo, to = moe_X(off)
    return fit_moe(X, t, Xo, to)


def fit_experts_alone(m: Measurements, top_k: int, fits: dict[str, FitError]) -> MoeCoef | None:
    """The fit of the experts' own work where ``m`` timed it (else None), its error into
    ``fits["moe_experts"]``."""
    if len(m.moe_experts) < 4:
        return None
    coef, fits["moe_experts"] = fit_routed(m, top_k, experts=True)
    return coef


def fit_attention(
    m: Measurements,
    prefill_forms: tuple[PrefillForm, ...] = PREFILL_FORMS,
    tiles_of_verify: dict[str, int] | None = None,
    wave_tiles: float = 0.0,
) -> tuple[dict[str, PrefillCoef], dict[str, DecodeCoef], dict[str, FitError]]:
    """The prefill and decode fits of every attention kind ``m`` has enough shapes for
    (``tiles_of_verify``: :func:`verify_tiles` of the model timed; ``wave_tiles``:
    :func:`prefill_wave_tiles` of it on the device timed)."""
    tiles_of_verify = tiles_of_verify or {}
    fits: dict[str, FitError] = {}
    prefill, decode = {}, {}
    for kind, rows in m.prefill.items():
        if len(rows) < 6:
            continue
        arr, oarr = _arr(rows, 3), _arr(m.prefill_off.get(kind, []), 3)
        prefill[kind], fits[f"prefill.{kind}"] = fit_prefill(
            arr[:, :2],
            arr[:, 2],
            oarr[:, :2],
            oarr[:, 2],
            forms=prefill_forms,
            wave_tiles=wave_tiles,
        )
    for kind, drows in m.decode.items():
        if len(drows) < 7:
            continue
        X, t = _decode_X(_arr(drows, 4))
        Xo, to = _decode_X(_arr(m.decode_off.get(kind, []), 4))
        decode[kind], fits[f"decode.{kind}"] = fit_decode(
            X, t, Xo, to, verify_tile=tiles_of_verify.get(kind, 1)
        )
    return prefill, decode, fits


def raw_of(m: Measurements) -> dict[str, list[list[float | str]]]:
    """The kernel measurements of ``m`` as a profile keeps them (``raw``; ``measurements_of``
    reads them back); the all-to-all rows start empty."""
    return {
        "prefill": [[k, *map(float, r)] for k, rows in m.prefill.items() for r in rows],
        "decode": [[k, *map(float, r)] for k, rows in m.decode.items() for r in rows],
        "moe": [list(map(float, r)) for r in m.moe],
        "a2a": [],
        "prefill_offgrid": [[k, *map(float, r)] for k, rows in m.prefill_off.items() for r in rows],
        "decode_offgrid": [[k, *map(float, r)] for k, rows in m.decode_off.items() for r in rows],
        "moe_offgrid": [list(map(float, r)) for r in m.moe_off],
        "moe_experts": [list(map(float, r)) for r in m.moe_experts],
        "moe_experts_offgrid": [list(map(float, r)) for r in m.moe_experts_off],
    }


def measurements_of(raw: dict[str, list[list[Any]]]) -> Measurements:
    """The kernel measurements a profile keeps (``raw``) as :class:`Measurements`."""
    m = Measurements()
    for key, into in (("prefill", m.prefill), ("prefill_offgrid", m.prefill_off)):
        for kind, *row in raw.get(key, []):
            into.setdefault(str(kind), []).append((int(row[0]), int(row[1]), float(row[2])))
    for key, dinto in (("decode", m.decode), ("decode_offgrid", m.decode_off)):
        for kind, *row in raw.get(key, []):
            dinto.setdefault(str(kind), []).append(
                (int(row[0]), int(row[1]), int(row[2]), float(row[3]))
            )
    m.moe = [(int(e), int(t), float(s)) for e, t, s in raw.get("moe", [])]
    m.moe_off = [(int(e), int(t), float(s)) for e, t, s in raw.get("moe_offgrid", [])]
    m.moe_experts = [(int(e), int(t), float(s)) for e, t, s in raw.get("moe_experts", [])]
    m.moe_experts_off = [
        (int(e), int(t), float(s)) for e, t, s in raw.get("moe_experts_offgrid", [])
    ]
    return m


def build_profile(bench: Bench, m: Measurements, name: str, command: str) -> Profile:
    """Fit every component and assemble a measured profile for ``bench.spec`` with its raw data
    (grid and off-grid) and fit errors (training, and off-grid only)."""
    from ..models.registry import load_hardware

    raw = raw_of(m)
    prefill, decode, moe, fits = fit_kernels(
        m,
        bench.spec.moe.top_k,
        tiles_of_verify=verify_tiles(bench.spec),
        wave_tiles=prefill_wave_tiles(bench.spec, bench.hardware),
    )
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
        moe_experts=fit_experts_alone(m, bench.spec.moe.top_k, fits),
        a2a=a2a,
        vision_seconds_per_image=m.vision,
        graphed=bool(over),
        host_overhead_s=HostOverhead(**over),
        engine_graphs=bench.engine_graphs,
        engine_prefill_graph_tokens=bench.engine_prefill_graph_tokens,
    )
    if m.engine and prefill and decode:
        stack = engine_stack(bench.spec, depth=m.engine_depth)
        eng = fit_engine_overhead(coefs, bench.hardware, m.engine, stack)
        coefs = coefs.model_copy(
            update={"engine_overhead": eng.model_copy(update={"stack_depth": m.engine_depth})}
        )
        raw["engine"] = [list(r) for r in m.engine]
    fitted = ModelFits(
        dtypes=bench.dtypes,
        widths=Widths.of(bench.spec),
        hardware={bench.hardware: coefs},
        fit=fits,
        raw={k: v for k, v in raw.items() if v},
    )
    return Profile(
        name=name,
        provenance=Provenance(
            kind="measured",
            device=bench.device_name,
            kernels=bench.kernels,
            kernel_versions=dict(bench.kernel_versions),
            torch=bench.software.get("torch"),
            cuda=bench.software.get("cuda"),
            date=date.today().isoformat(),
            command=command,
            duration_s=round(m.seconds, 1),
            note=f"host {platform.node()}; copy bandwidth {m.copy_bandwidth / 1e12:.2f} TB/s",
        ),
        models={bench.spec.name: fitted},
    )


ENGINE_MAX_EXPERTS = 48  # local experts of the engine stack (one rank's share at EP8 of 384)


def engine_stack(
    spec: ModelSpec, max_experts: int = ENGINE_MAX_EXPERTS, depth: int = 1
) -> ModelSpec:
    """The engine core's reduced-depth stack of ``spec``: at most ``depth`` layers per layer
    group (so every kind, encoder and decoder, is there) and at most ``max_experts`` routed
    experts. For ``deepseek-v4.1-flash`` at depth 1 this is ``deepseek-v4.1-flash-mini``'s
    layout."""
    if depth < 1:
        raise ValueError(f"engine stack depth must be >= 1, got {depth}")
    groups = tuple(g.model_copy(update={"count": min(g.count, depth)}) for g in spec.layer_groups)
    moe = spec.moe.model_copy(
        update={
            "routed_experts": min(spec.moe.routed_experts, max_experts),
            "dense_layers": 0,
            "hash_routed_layers": 0,
            "expert_groups": 1,
        }
    )
    suffix = "engine-stack" if depth == 1 else f"engine-stack{depth}"
    return spec.model_copy(
        update={"name": f"{spec.name}-{suffix}", "layer_groups": groups, "moe": moe}
    )


def fit_engine_overhead(
    coefs: HardwareCoefs, hardware: str, rows: list[EngineRow], stack: ModelSpec
) -> EngineOverhead:
    """What the engine core's step costs beyond its kernels: residual = measured step − the
    eager kernel models of ``stack`` (the timed engine's layers), fitted (non-negative least
    squares) as a constant per step plus a cost per sequence plus a cost per token (prefill:
    prompt tokens; decode: context tokens). Prefill steps the engine replayed as CUDA graphs
    give a constant of their own (``fit_graphed_prefill``)."""
    from ..models.cost import PoolShape
    from ..models.profile_cost import ProfileStepCost
    from ..models.registry import load_hardware

    cost = ProfileStepCost(
        stack,
        load_hardware(hardware),
        PoolShape(1, 0),
        coefs,
        StepParams(comm_overlap=0.0, step_overhead_s=0.0),
        eager=True,
    )
    graph_fit, rows = fit_graphed_prefill(coefs, hardware, rows, stack)
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
    loop = fit_loop_gaps(rows)
    additive = EngineOverhead(
        **loop,
        **graph_fit,
        prefill_step_s=fitted["prefill"][0],
        prefill_per_seq_s=fitted["prefill"][1],
        prefill_per_token_s=fitted["prefill"][2],
        decode_step_s=fitted["decode"][0],
        decode_per_seq_s=fitted["decode"][1],
        decode_per_kv_token_s=fitted["decode"][2],
    )
    pre = [r for r in rows if r[0] == "prefill"]
    if len(pre) < 3:
        return additive
    # the other form for the eager prefill: the host's launches overlap the GPU's work, step =
    # max(GPU model, host) + ρ·min(GPU model, host) with host = h0 + h·prompts + h·tokens and ρ
    # the exposed share of the shorter (0: full overlap, 1: the additive form); the form that
    # fits the timed steps better is kept. On the H200 (V4.1-Flash engine stack, 21 steps of
    # 1–4 prompts × 128–16,384 tokens): additive 12.3 % MAPE, full overlap 4.4 %, ρ = 0.32 1.5 %.
    gpu = ProfileStepCost(
        stack, load_hardware(hardware), PoolShape(1, 0), coefs,
        StepParams(comm_overlap=0.0, step_overhead_s=0.0),
    )  # fmt: skip
    G = np.array([gpu.prefill_step([[(n, 0)] * b]) for _, b, n, _, _ in pre])
    F = np.array([(1.0, b, b * n) for _, b, n, _, _ in pre], dtype=float)
    t_pre = np.array([r[4] for r in pre])
    scale = F.max(axis=0)

    def rel_gap(x: np.ndarray) -> np.ndarray:
        host = (F / scale) @ x[:3]
        return (np.maximum(G, host) + x[3] * np.minimum(G, host) - t_pre) / t_pre

    x0 = np.array([*np.full(3, float(t_pre.min())), 0.1])
    upper = np.array([np.inf, np.inf, np.inf, 1.0])
    x = least_squares(rel_gap, x0, bounds=(0, upper)).x
    h = x[:3] / scale
    overlap = additive.model_copy(
        update={
            "prefill_step_s": 0.0,
            "prefill_per_seq_s": 0.0,
            "prefill_per_token_s": 0.0,
            "prefill_host_s": float(h[0]),
            "prefill_host_per_seq_s": float(h[1]),
            "prefill_host_per_token_s": float(h[2]),
            "prefill_host_exposed": float(x[3]),
        }
    )
    errs = []
    for form in (additive, overlap):
        c = ProfileStepCost(
            stack, load_hardware(hardware), PoolShape(1, 0),
            coefs.model_copy(update={"engine_overhead": form}),
            StepParams(comm_overlap=0.0, step_overhead_s=0.0), eager=True,
        )  # fmt: skip
        steps = (
            np.array([c.prefill_step([[(n, 0)] * b]) for _, b, n, _, _ in pre]) - c.prefill_loop_s
        )
        errs.append(float(np.mean(np.abs(steps / t_pre - 1))))
    return overlap if errs[1] < errs[0] else additive


def fit_graphed_prefill(
    coefs: HardwareCoefs, hardware: str, rows: list[EngineRow], stack: ModelSpec
) -> tuple[dict[str, float], list[EngineRow]]:
    """What a prefill step replayed as a CUDA graph costs beyond the graphed kernel models: a
    constant of either sign (graph launch and the step's host work, less the fixed costs that the
    one-kernel-at-a-time fits count and a graph overlaps), a cost per prompt and a cost per token
    (the engine's work between the timed kernels), fitted by least squares on relative error
    (per prompt and per token non-negative) on the timed steps of at most
    ``engine_prefill_graph_tokens`` tokens; and the rows left for the eager fits."""
    from ..models.cost import PoolShape
    from ..models.profile_cost import ProfileStepCost
    from ..models.registry import load_hardware

    limit = coefs.engine_prefill_graph_tokens
    graphed = [r for r in rows if r[0] == "prefill" and r[1] * r[2] <= limit]
    if not graphed:
        return {}, rows
    gpu = ProfileStepCost(
        stack, load_hardware(hardware), PoolShape(1, 0), coefs,
        StepParams(comm_overlap=0.0, step_overhead_s=0.0),
    )  # fmt: skip
    t = np.array([r[4] for r in graphed])
    resid = t - np.array([gpu.prefill_step([[(n, 0)] * b]) for _, b, n, _, _ in graphed])
    F = np.array([(1.0, b, b * n) for _, b, n, _, _ in graphed], dtype=float)
    lower = (-np.inf, 0.0, 0.0)
    x = lsq_linear(F / t[:, None], resid / t, bounds=(lower, np.inf)).x
    rest = [r for r in rows if not (r[0] == "prefill" and r[1] * r[2] <= limit)]
    keys = ("prefill_graph_step_s", "prefill_graph_per_seq_s", "prefill_graph_per_token_s")
    return dict(zip(keys, map(float, x), strict=True)), rest


def fit_loop_gaps(rows: list[EngineRow]) -> dict[str, float]:
    """The replay loop's time between steps: decode as a constant plus a cost per sequence
    (non-negative least squares on the per-batch medians), prefill as the median gap."""
    out = {"decode_loop_s": 0.0, "decode_loop_per_seq_s": 0.0, "prefill_loop_s": 0.0}
    dec = [(r[1], r[4]) for r in rows if r[0] == "decode_gap"]
    if len(dec) >= 3:
        by: dict[int, list[float]] = {}
        for b, g in dec:
            by.setdefault(int(b), []).append(g)
        B = np.array(sorted(by), dtype=float)
        med = np.array([np.median(by[int(b)]) for b in B])
        if B.size >= 2:
            F = np.stack([np.ones_like(B), B], axis=1)
            res = lsq_linear(F, med, bounds=(0, np.inf))
            out["decode_loop_s"], out["decode_loop_per_seq_s"] = (float(v) for v in res.x)
        else:
            out["decode_loop_s"] = float(med[0])
    pre = [r[4] for r in rows if r[0] == "prefill_gap"]
    if pre:
        out["prefill_loop_s"] = max(0.0, float(np.median(pre)))
    return out
