"""DeepEP (V1) dispatch and combine on 2–8 GPUs of one node, and their overlap with expert GEMMs.

What it is for (issue 33): the all-to-all of ``models/comm.py`` charges an exchange a latency
plus bytes over an achieved share of the NVLink bandwidth (``AllToAllParams``), and the normal
kernels a share of the SMs. This bench measures DeepSeek's own kernels on one node so that
``calibration/ep_fit.py`` can fit those constants.

Run it (NVLink multicast is forced off in every process, see ``ep.no_multicast_env``)::

    torchrun --nproc-per-node N -m deepinfer_sim.kernels.deepep_bench --out DIR
    python -m deepinfer_sim.kernels.deepep_bench --out DIR [--world N]  # spawns N ranks (default:
                                                                         # every visible GPU)
    python -m deepinfer_sim.kernels.deepep_bench --stand-in --world 2 --out DIR   # CPU, no DeepEP
    python -m deepinfer_sim.kernels.deepep_bench --one-rank-probe --out DIR       # one GPU

For each model shape (hidden, top-k, routed experts of ``configs/models``; a model whose experts do
not divide over the N ranks is skipped, and said so) and each mode:

- **normal** (prefill kernels; DeepEP V1 runs them on 2, 4 or 8 ranks only): FP8 dispatch (a
  ``(e4m3 [T, hidden], float32 scales [T, hidden / 128])`` tuple) of T tokens per rank with their
  top-k indices and weights, then the BF16 combine of what arrived, at T in ``--normal-tokens``.
  A token goes once to every rank that holds one of its experts (deduplicated per rank).
- **low_latency** (decode kernels): FP8 dispatch and BF16 combine of every (token, expert) copy,
  at T in ``--ll-tokens``; the receive buffers are sized for the largest T (rounded up to 4), as
  an engine sizes them once for its CUDA graphs.

Dispatch and combine are timed separately (CUDA events on the calling stream, ``--warmup``
untimed rounds, the median of ``--iters``; a barrier and a device synchronize before each). Bytes
come from the actual routing: rows rank s sends rank d (token-expert copies, or token-rank copies
in normal mode), rows staying on the rank itself counted apart; an FP8 row is ``hidden`` bytes
plus ``hidden / 128`` float32 scales, a BF16 row ``2 · hidden`` (DeepEP's 16-byte per-message
header in low-latency mode and the top-k metadata of the normal kernels are not counted).

**Overlap**: a stand-in of the rank's expert work — ``torch.bmm`` in bf16 over the E / N local
experts, each with ``ceil(T · top_k / (E / N))`` rows (the copies a rank receives on average) ×
``hidden`` × ``--gemm-intermediate`` (default: 2 × the expert width, the gate-up GEMM) — is timed
alone, the exchange (dispatch then combine) alone, and both launched together (the GEMM first on
a second stream, then the exchange on the calling stream; DeepEP runs its kernels on its own
high-priority stream). Rows keep ``gemm_alone_s``, ``exchange_alone_s``, ``both_s`` and
``gemm_in_both_s`` (the GEMM's own finish, from the common start); derived: the GEMM's slowdown,
the hidden share of the exchange ``(gemm_alone + exchange_alone − both) / exchange_alone``
clipped to [0, 1], and the SM share the exchange took from the GEMM (``overlap_derived``).

Routing: scores drawn per rank from a seeded generator (the same seeds on every run), top-k of
them: uniform without replacement, and with ``--skew S`` also a skewed draw (expert e weighted
``(e + 1)^−S``, Gumbel top-k). Every rank regenerates every rank's routing, so the byte counts
need no communication. Times of a row are the slowest rank's median (per-rank medians kept).

Rank 0 writes ``DIR/deepep_bench.json`` (after each mode, so a later failure keeps what ran) and
prints a table. The collective sits behind ``Exchange``: ``DeepEPExchange`` (imports ``deep_ep``
lazily) or ``StandInExchange`` (one process, a virtual clock advanced by a time computed from the
bytes with a known latency and bandwidth; what the CPU tests run). Without ``deep_ep`` or with
fewer than 2 GPUs the command exits with one ``error:`` line unless ``--stand-in`` is given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import numpy as np
import torch

from ._util import FP8, FP8_MAX, cuda_event_seconds, spawn_ranks
from .ep import no_multicast_env

no_multicast_env()  # before anything can create a communicator

Mode = Literal["low_latency", "normal"]
MODES: tuple[Mode, ...] = ("low_latency", "normal")
LL_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NORMAL_TOKENS = (1024, 2048, 4096, 8192, 16384)
DEFAULT_MODELS = ("deepseek-v3", "deepseek-v4.1-flash")
INTRANODE_WORLDS = (2, 4, 8)  # DeepEP V1's intranode kernels (SWITCH_RANKS in launch.cuh)
DEFAULT_NUM_SMS = 20  # deep_ep.Buffer.num_sms
FP8_GROUP = 128  # one float32 scale per 128 values
JSON_NAME = "deepep_bench.json"


# --- shapes -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the exchange of one MoE layer depends on."""

    name: str
    hidden: int
    top_k: int
    experts: int
    expert_width: int

    def local_experts(self, world: int) -> int:
        return self.experts // world


MODELS_DIR = Path(__file__).resolve().parents[1] / "configs" / "models"


def model_shape(ref: str) -> ModelShape:
    """A bundled model (``deepseek-v3``) or a model YAML path, through the model registry; where
    the registry's dependencies are missing (pydantic, on a bare GPU image), a bundled model's
    YAML read as it is."""
    try:
        from ..models.registry import load_model
    except ImportError:
        return _yaml_shape(ref)
    m = load_model(ref)
    return ModelShape(m.name, m.hidden, m.moe.top_k, m.moe.routed_experts, m.moe.expert_width)


def _yaml_shape(ref: str) -> ModelShape:
    """A bundled model's shape from its file, unvalidated (PyYAML alone)."""
    import yaml

    path = MODELS_DIR / f"{ref}.yaml"
    if not path.is_file():
        raise ImportError(f"no model registry here, and no bundled model {ref!r} ({path})")
    spec = yaml.safe_load(path.read_text())
    moe = spec["moe"]
    return ModelShape(
        spec["name"], spec["hidden"], moe["top_k"], moe["routed_experts"], moe["expert_width"]
    )


def shapes_for_world(
    shapes: Sequence[ModelShape], world: int
) -> tuple[list[ModelShape], list[str]]:
    """The shapes whose routed experts divide over ``world`` ranks, and a line per skipped one."""
    kept, skipped = [], []
    for s in shapes:
        if s.experts % world == 0:
            kept.append(s)
        else:
            skipped.append(
                f"{s.name}: {s.experts} routed experts do not divide over {world} ranks; skipped"
            )
    return kept, skipped


def fp8_row_bytes(hidden: int) -> int:
    """One FP8 row: ``hidden`` e4m3 bytes and one float32 scale per 128 values."""
    return hidden + (hidden // FP8_GROUP) * 4


def bf16_row_bytes(hidden: int) -> int:
    return 2 * hidden


@dataclass(frozen=True, slots=True)
class GemmShape:
    """The grouped-GEMM stand-in of a rank's expert work: ``experts`` × [rows, k] @ [k, n]."""

    experts: int
    rows: int
    k: int
    n: int

    @property
    def flops(self) -> float:
        return 2.0 * self.experts * self.rows * self.k * self.n


def gemm_shape(shape: ModelShape, tokens: int, world: int, intermediate: int | None) -> GemmShape:
    """The rank's local experts, each with the rows a rank receives on average spread evenly."""
    local = shape.local_experts(world)
    rows = max(1, math.ceil(tokens * shape.top_k / local))
    return GemmShape(local, rows, shape.hidden, intermediate or 2 * shape.expert_width)


# --- routing and bytes --------------------------------------------------------------------------


def routing_seed(seed: int, rank: int, tokens: int, model_index: int, skew: float) -> int:
    """A reproducible seed per (run seed, rank, size, model, routing)."""
    mix = (seed, rank, tokens, model_index, round(skew * 1000))
    h = 1469598103934665603
    for v in mix:
        h = ((h ^ (v & 0xFFFFFFFFFFFF)) * 1099511628211) % (1 << 61)
    return h


def route(tokens: int, experts: int, top_k: int, *, seed: int, skew: float = 0.0) -> torch.Tensor:
    """``[tokens, top_k]`` int64 expert indices, distinct per token: the top-k of random scores
    (uniform without replacement), or with ``skew > 0`` a Gumbel top-k draw weighting expert e by
    ``(e + 1)^−skew``. On the CPU, from its own generator."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand((tokens, experts), generator=g)
    if skew > 0:
        gumbel = -torch.log(-torch.log(u.clamp(1e-30, 1 - 1e-7)))
        log_w = -skew * torch.log(torch.arange(1, experts + 1, dtype=torch.float32))
        scores = gumbel + log_w
    else:
        scores = u
    return torch.topk(scores, top_k, dim=1).indices.to(torch.int64)


def copies_from(topk_idx: torch.Tensor, experts: int, world: int, *, dedup: bool) -> np.ndarray:
    """Rows one rank sends to each rank (``[world]``; its own index: rows that stay local). A row
    per (token, expert) copy, or with ``dedup`` one per (token, rank holding one of its experts)."""
    per_rank = experts // world
    dest = (topk_idx.to(torch.int64) // per_rank).clamp(0, world - 1)
    if dedup:
        hit = torch.zeros((dest.shape[0], world), dtype=torch.bool)
        hit.scatter_(1, dest, True)
        counts = hit.sum(dim=0)
    else:
        counts = torch.bincount(dest.reshape(-1), minlength=world)
    return counts.numpy().astype(np.int64)


def copies_matrix(
    topk_by_rank: Sequence[torch.Tensor], experts: int, world: int, *, dedup: bool
) -> np.ndarray:
    """``[world, world]``: rows rank s sends rank d (the diagonal stays on the rank)."""
    return np.stack([copies_from(t, experts, world, dedup=dedup) for t in topk_by_rank])


@dataclass(frozen=True, slots=True)
class Bytes:
    """One exchange's bytes per rank over the links (rows staying on a rank move no link)."""

    sent: list[int]  # per rank, to other ranks
    received: list[int]  # per rank, from other ranks

    @property
    def busiest(self) -> int:
        """The busiest GPU port in one direction: the slowest rank's share of the exchange."""
        return max(max(self.sent), max(self.received))

    @property
    def mean_sent(self) -> float:
        return float(np.mean(self.sent))


def exchange_bytes(copies: np.ndarray, row_bytes: int, *, reverse: bool = False) -> Bytes:
    """Bytes of an exchange moving ``copies[s, d]`` rows of ``row_bytes`` from s to d (``reverse``:
    from d back to s, as the combine returns what the dispatch delivered)."""
    m = np.array(copies, dtype=np.int64)
    if reverse:
        m = m.T
    off = m - np.diag(np.diag(m))
    return Bytes(
        [int(v) * row_bytes for v in off.sum(axis=1)],
        [int(v) * row_bytes for v in off.sum(axis=0)],
    )


def overlap_derived(
    gemm_alone: float, exchange_alone: float, both: float, gemm_in_both: float
) -> dict[str, float]:
    """What the concurrent run says, from the four times.

    - ``hidden_share``: the share of the exchange hidden under the GEMM,
      ``(gemm_alone + exchange_alone − both) / exchange_alone`` clipped to [0, 1];
    - ``gemm_slowdown``: ``gemm_in_both / gemm_alone``;
    - ``sm_share``: the share of the GEMM's speed the exchange took while it ran. The GEMM runs
      at ``1 − s`` while the exchange (X) runs and at full speed after: it ends at
      ``G / (1 − s)`` when that is within X, else at ``G + s · X``; inverted here, clipped to
      [0, 1).
    """
    g, x, b, gb = gemm_alone, exchange_alone, both, gemm_in_both
    hidden = min(1.0, max(0.0, (g + x - b) / x)) if x > 0 else 0.0
    slowdown = gb / g if g > 0 else float("nan")
    if x <= 0 or g <= 0:
        share = 0.0
    elif gb <= x:
        share = 1.0 - g / gb if gb > 0 else 0.0
    else:
        share = (gb - g) / x
    share = min(max(share, 0.0), 0.999)
    return {"hidden_share": hidden, "gemm_slowdown": slowdown, "sm_share": share}


# --- the exchange interface ---------------------------------------------------------------------


@dataclass(slots=True)
class Case:
    """One (mode, model, tokens) measurement's inputs; the exchange keeps its state in ``state``."""

    mode: Mode
    shape: ModelShape
    tokens: int
    topk_idx: torch.Tensor  # this rank's routing, on the CPU
    copies: np.ndarray  # [world, world] rows s -> d, every rank's
    gemm: GemmShape | None
    routing: str = "uniform"
    state: dict[str, Any] = field(default_factory=dict)


class Exchange(Protocol):
    """The collective behind the bench: DeepEP on GPUs, or a stand-in on the CPU."""

    rank: int
    world: int
    num_sms: int

    def supports(self, mode: Mode) -> str | None:
        """None, or why this exchange cannot run ``mode`` at its world size."""
        ...

    def begin_mode(self, mode: Mode, shapes: Sequence[ModelShape], max_tokens: int) -> None:
        """Set up buffers for ``mode`` (sized for every shape and ``max_tokens`` per rank)."""
        ...

    def begin_model(self, mode: Mode, shape: ModelShape, gemm_n: int | None) -> None: ...

    def prepare(self, case: Case) -> None:
        """Device inputs of ``case`` (in ``case.state``); may run one untimed exchange."""
        ...

    def dispatch(self, case: Case) -> None: ...

    def combine(self, case: Case) -> None:
        """Send back what the latest ``dispatch`` of ``case`` delivered."""
        ...

    def gemm(self, case: Case) -> None: ...

    def elapsed(self, fn: Callable[[], None]) -> float:
        """Seconds ``fn`` takes on the device."""
        ...

    def concurrent(
        self, exchange: Callable[[], None], gemm: Callable[[], None]
    ) -> tuple[float, float, float]:
        """Both launched together: (both, exchange's end, GEMM's end), seconds from the start."""
        ...

    def sync(self) -> None:
        """Barrier over the ranks, device idle."""
        ...

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (on every rank)."""
        ...

    def end_mode(self) -> None: ...

    def info(self) -> dict[str, Any]:
        """Device and library versions for the JSON."""
        ...


# --- the stand-in -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StandInParams:
    """The stand-in's truth: an exchange takes ``latency + busiest bytes / bandwidth``; the GEMM
    ``flops / gemm_flops_per_s``, slowed to ``1 − sm_share`` of its speed while an exchange runs;
    each time times ``exp(N(0, noise))``."""

    latency_s: dict[str, float] = field(
        default_factory=lambda: {"low_latency": 8e-6, "normal": 25e-6}
    )
    bandwidth: dict[str, float] = field(
        default_factory=lambda: {"low_latency": 2.2e11, "normal": 3.3e11}
    )
    sm_share: dict[str, float] = field(
        default_factory=lambda: {"low_latency": 0.05, "normal": 0.15}
    )
    gemm_flops_per_s: float = 6e14
    noise: float = 0.01
    seed: int = 0


class StandInExchange:
    """One process standing in for ``world`` ranks: nothing moves, a virtual clock advances by the
    time the parameters give for the case's bytes (its busiest link). ``gather`` gives every rank
    this rank's values."""

    def __init__(self, world: int, params: StandInParams | None = None, rank: int = 0) -> None:
        self.rank, self.world = rank, world
        self.num_sms = DEFAULT_NUM_SMS
        self.params = params or StandInParams()
        self.now = 0.0
        self._rng = np.random.default_rng(self.params.seed)
        self._mode: Mode | None = None

    def supports(self, mode: Mode) -> str | None:
        return None

    def begin_mode(self, mode: Mode, shapes: Sequence[ModelShape], max_tokens: int) -> None:
        self._mode = mode

    def begin_model(self, mode: Mode, shape: ModelShape, gemm_n: int | None) -> None:
        pass

    def prepare(self, case: Case) -> None:
        h = case.shape.hidden
        case.state["dispatch_busiest"] = exchange_bytes(case.copies, fp8_row_bytes(h)).busiest
        case.state["combine_busiest"] = exchange_bytes(
            case.copies, bf16_row_bytes(h), reverse=True
        ).busiest

    def _noisy(self, t: float) -> float:
        return t * float(np.exp(self._rng.normal(0.0, self.params.noise)))

    def _take(self, case: Case, key: str) -> None:
        p = self.params
        t = p.latency_s[case.mode] + case.state[key] / p.bandwidth[case.mode]
        self.now += self._noisy(t)

    def dispatch(self, case: Case) -> None:
        self._take(case, "dispatch_busiest")

    def combine(self, case: Case) -> None:
        self._take(case, "combine_busiest")

    def gemm(self, case: Case) -> None:
        assert case.gemm is not None
        self.now += self._noisy(case.gemm.flops / self.params.gemm_flops_per_s)

    def elapsed(self, fn: Callable[[], None]) -> float:
        t0 = self.now
        fn()
        return self.now - t0

    def concurrent(
        self, exchange: Callable[[], None], gemm: Callable[[], None]
    ) -> tuple[float, float, float]:
        x = self.elapsed(exchange)
        g = self.elapsed(gemm)
        s = self.params.sm_share[self._mode or "normal"]
        gemm_end = g / (1 - s) if g / (1 - s) <= x else g + s * x
        self.now += max(x, gemm_end) - (x + g)  # the clock ran both in turn
        return max(x, gemm_end), x, gemm_end

    def sync(self) -> None:
        pass

    def gather(self, obj: Any) -> list[Any]:
        return [obj] * self.world

    def end_mode(self) -> None:
        self._mode = None

    def info(self) -> dict[str, Any]:
        p = self.params
        return {
            "device": "stand-in (CPU, no GPU)",
            "deep_ep": None,
            "nccl": None,
            "stand_in": {
                "latency_s": dict(p.latency_s),
                "bandwidth_bytes_per_s": dict(p.bandwidth),
                "sm_share": dict(p.sm_share),
                "gemm_flops_per_s": p.gemm_flops_per_s,
                "noise": p.noise,
                "seed": p.seed,
            },
        }


# --- DeepEP -------------------------------------------------------------------------------------


def per_token_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepEP's FP8 dispatch input: e4m3 values ``[T, hidden]`` and one float32 scale per 128
    values ``[T, hidden / 128]`` (column-major, as DeepEP's tests hand it over)."""
    t, h = x.shape
    groups = x.float().view(t, h // FP8_GROUP, FP8_GROUP)
    amax = groups.abs().amax(dim=2).clamp_min(1e-4)
    q = (groups * (FP8_MAX / amax).unsqueeze(2)).to(FP8).view(t, h)
    scales = (amax / FP8_MAX).contiguous()
    return q, scales.T.contiguous().T


class DeepEPExchange:
    """``deep_ep.Buffer`` over a process group, one GPU per rank.

    Normal mode: a Buffer with NVLink bytes only (no NVSHMEM), sized by the recommended configs'
    hints for every shape. Low-latency mode: a Buffer with ``low_latency_mode=True`` and the RDMA
    (NVSHMEM) bytes ``get_low_latency_rdma_size_hint`` gives for the largest shape, cleaned
    before each model. Normal mode runs first: NVSHMEM then starts once per process.
    """

    def __init__(self, group: Any, device: torch.device, num_sms: int = DEFAULT_NUM_SMS) -> None:
        import deep_ep  # torch first (imported above), as DeepEP's build on the H200 needs

        self._ep = deep_ep
        self.group = group
        self.rank, self.world = group.rank(), group.size()
        self.device = device
        self.num_sms = num_sms
        deep_ep.Buffer.set_num_sms(num_sms)
        self.force = False  # the one-rank probe: go past what DeepEP refuses, recording it
        self.refusals: list[str] = []
        self._buffer: Any = None
        self._mode: Mode | None = None
        self._num_max = 0
        self._ll_y: torch.Tensor | None = None
        self._weights: torch.Tensor | None = None
        self._side = torch.cuda.Stream(device)

    def supports(self, mode: Mode) -> str | None:
        if mode == "normal" and self.world not in INTRANODE_WORLDS and not self.force:
            return (
                f"DeepEP V1's intranode (normal) kernels run on 2, 4 or 8 ranks, not {self.world}"
            )
        return None

    def _destroy(self) -> None:
        buffer, self._buffer = self._buffer, None  # a failed destroy is not retried
        if buffer is not None:
            buffer.destroy()

    def begin_mode(self, mode: Mode, shapes: Sequence[ModelShape], max_tokens: int) -> None:
        Buffer = self._ep.Buffer
        self._destroy()
        if mode == "normal":
            configs = [self._config("dispatch"), self._config("combine")]
            nvl = max(
                c.get_nvl_buffer_size_hint(bf16_row_bytes(s.hidden), self.world)
                for c in configs
                for s in shapes
            )
            self._buffer = Buffer(self.group, nvl, 0, explicitly_destroy=True)
        else:
            self._num_max = 4 * math.ceil(max_tokens / 4)  # DeepEP: world · max % 4 == 0
            os.environ["NVSHMEM_QP_DEPTH"] = str(max(1024, 2 * (self._num_max + 1)))
            rdma = max(
                Buffer.get_low_latency_rdma_size_hint(
                    self._num_max, s.hidden, self.world, s.experts
                )
                for s in shapes
            )
            self._buffer = Buffer(
                self.group,
                0,
                rdma,
                low_latency_mode=True,
                num_qps_per_rank=max(s.local_experts(self.world) for s in shapes),
                explicitly_destroy=True,
            )
        self._mode = mode

    def begin_model(self, mode: Mode, shape: ModelShape, gemm_n: int | None) -> None:
        self._ll_y = self._weights = None
        torch.cuda.empty_cache()
        local = shape.local_experts(self.world)
        if mode == "low_latency":
            self._buffer.clean_low_latency_buffer(self._num_max, shape.hidden, shape.experts)
            self._ll_y = torch.empty(
                (local, self.world * self._num_max, shape.hidden),
                dtype=torch.bfloat16,
                device=self.device,
            ).normal_(0, 0.1)
        if gemm_n is not None:
            self._weights = torch.empty(
                (local, shape.hidden, gemm_n), dtype=torch.bfloat16, device=self.device
            ).normal_(0, 0.02)

    def prepare(self, case: Case) -> None:
        dev, s, st = self.device, case.shape, case.state
        x = torch.empty((case.tokens, s.hidden), dtype=torch.bfloat16, device=dev).normal_(0, 1)
        st["topk"] = case.topk_idx.to(dev).to(self._ep.topk_idx_t).contiguous()
        st["weights"] = torch.rand((case.tokens, s.top_k), dtype=torch.float32, device=dev)
        if case.mode == "normal":
            st["x"] = per_token_fp8(x)
            per_rank, _, per_expert, in_rank, _ = self._buffer.get_dispatch_layout(
                st["topk"], s.experts
            )
            st["layout"] = (per_rank, per_expert, in_rank)
            self.dispatch(case)  # the received row count sizes the combine's input
            rows = st["recv_rows"]
            st["y"] = torch.empty((rows, s.hidden), dtype=torch.bfloat16, device=dev).normal_(0, 1)
        else:
            st["x"] = x
        if case.gemm is not None:
            g = case.gemm
            st["a"] = torch.empty((g.experts, g.rows, g.k), dtype=torch.bfloat16, device=dev)
            st["a"].normal_(0, 1)

    def _config(self, kind: str) -> Any:
        Buffer = self._ep.Buffer
        get = Buffer.get_dispatch_config if kind == "dispatch" else Buffer.get_combine_config
        if not self.force:
            return get(self.world)
        try:
            return get(self.world)
        except AssertionError as exc:  # e.g. "Unsupported number of EP ranks: 1"
            line = f"get_{kind}_config({self.world}): {_one_line(exc)}"
            if line not in self.refusals:
                self.refusals.append(line)
            return self._ep.Config(self.num_sms, 6, 256, 6, 128)

    def dispatch(self, case: Case) -> None:
        st = case.state
        if case.mode == "normal":
            per_rank, per_expert, in_rank = st["layout"]
            recv_x, _, recv_w, _, handle, _ = self._buffer.dispatch(
                st["x"],
                num_tokens_per_rank=per_rank,
                is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert,
                topk_idx=st["topk"],
                topk_weights=st["weights"],
                config=self._config("dispatch"),
            )
            st["handle"], st["recv_weights"] = handle, recv_w
            st["recv_rows"] = int(recv_x[0].shape[0])
        else:
            _, _, handle, _, _ = self._buffer.low_latency_dispatch(
                st["x"],
                st["topk"],
                self._num_max,
                case.shape.experts,
                use_fp8=True,
                async_finish=False,
                return_recv_hook=False,
            )
            st["handle"] = handle

    def combine(self, case: Case) -> None:
        st = case.state
        if case.mode == "normal":
            self._buffer.combine(
                st["y"],
                st["handle"],
                topk_weights=st["recv_weights"],
                config=self._config("combine"),
            )
        else:
            self._buffer.low_latency_combine(
                self._ll_y,
                st["topk"],
                st["weights"],
                st["handle"],
                async_finish=False,
                return_recv_hook=False,
            )

    def gemm(self, case: Case) -> None:
        assert self._weights is not None, "begin_model without a GEMM"
        torch.bmm(case.state["a"], self._weights)

    def elapsed(self, fn: Callable[[], None]) -> float:
        return cuda_event_seconds(fn)

    def concurrent(
        self, exchange: Callable[[], None], gemm: Callable[[], None]
    ) -> tuple[float, float, float]:
        cur = torch.cuda.current_stream(self.device)
        t0, x_end, g_end, end = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        t0.record(cur)
        self._side.wait_event(t0)
        with torch.cuda.stream(self._side):
            gemm()
            g_end.record(self._side)
        exchange()
        x_end.record(cur)
        cur.wait_stream(self._side)
        end.record(cur)
        end.synchronize()
        return (
            float(t0.elapsed_time(end)) / 1e3,
            float(t0.elapsed_time(x_end)) / 1e3,
            float(t0.elapsed_time(g_end)) / 1e3,
        )

    def sync(self) -> None:
        import torch.distributed as dist

        torch.cuda.synchronize(self.device)
        dist.barrier(group=self.group)
        torch.cuda.synchronize(self.device)

    def gather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def end_mode(self) -> None:
        self._ll_y = self._weights = None
        self._destroy()
        self._mode = None

    def info(self) -> dict[str, Any]:
        return {
            "device": torch.cuda.get_device_name(self.device),
            "deep_ep": deep_ep_version(),
            "nccl": nccl_version(),
            "cuda": torch.version.cuda,
            "sm_count": torch.cuda.get_device_properties(self.device).multi_processor_count,
            "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE"),
            "refusals": list(self.refusals),
        }


def deep_ep_version() -> dict[str, Any]:
    """What can be known of the DeepEP build: its package version if installed, its path, and
    ``DEEP_EP_COMMIT`` from the environment (the vendor archive's name carries the commit)."""
    from importlib import metadata

    out: dict[str, Any] = {"commit": os.environ.get("DEEP_EP_COMMIT")}
    try:
        out["version"] = metadata.version("deep_ep")
    except metadata.PackageNotFoundError:
        out["version"] = None
    try:
        import deep_ep

        out["path"] = str(Path(deep_ep.__file__).parent)
    except Exception:
        out["path"] = None
    return out


def nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)


# --- the bench loop -----------------------------------------------------------------------------


@dataclass(slots=True)
class BenchConfig:
    models: tuple[str, ...] = DEFAULT_MODELS
    modes: tuple[Mode, ...] = ("normal", "low_latency")  # normal first: NVSHMEM starts last
    ll_tokens: tuple[int, ...] = LL_TOKENS
    normal_tokens: tuple[int, ...] = NORMAL_TOKENS
    iters: int = 20
    warmup: int = 5
    seed: int = 0
    skews: tuple[float, ...] = (0.0,)  # 0: uniform
    overlap: bool = True
    gemm_intermediate: int | None = None
    keep_going: bool = True  # an exception in one (mode, model) is recorded, the rest runs


def routing_name(skew: float) -> str:
    return "uniform" if skew == 0 else f"skew{skew:g}"


def _median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


def measure_case(ex: Exchange, case: Case, cfg: BenchConfig) -> dict[str, Any]:
    """This rank's medians for one case."""
    d_times, c_times = [], []
    for i in range(cfg.warmup + cfg.iters):
        ex.sync()
        d = ex.elapsed(lambda: ex.dispatch(case))
        ex.sync()
        c = ex.elapsed(lambda: ex.combine(case))
        if i >= cfg.warmup:
            d_times.append(d)
            c_times.append(c)
    out: dict[str, Any] = {"dispatch_s": _median(d_times), "combine_s": _median(c_times)}
    if case.gemm is None:
        return out

    def round_trip() -> None:
        ex.dispatch(case)
        ex.combine(case)

    g_times, x_times, both, x_in, g_in = [], [], [], [], []
    for i in range(cfg.warmup + cfg.iters):
        ex.sync()
        g = ex.elapsed(lambda: ex.gemm(case))
        ex.sync()
        x = ex.elapsed(round_trip)
        ex.sync()
        b, xb, gb = ex.concurrent(round_trip, lambda: ex.gemm(case))
        if i >= cfg.warmup:
            g_times.append(g)
            x_times.append(x)
            both.append(b)
            x_in.append(xb)
            g_in.append(gb)
    out.update(
        gemm_alone_s=_median(g_times),
        exchange_alone_s=_median(x_times),
        both_s=_median(both),
        exchange_in_both_s=_median(x_in),
        gemm_in_both_s=_median(g_in),
    )
    return out


TIME_KEYS = (
    "dispatch_s",
    "combine_s",
    "gemm_alone_s",
    "exchange_alone_s",
    "both_s",
    "exchange_in_both_s",
    "gemm_in_both_s",
)


def make_row(
    case: Case, per_rank: Sequence[dict[str, Any]], world: int, num_sms: int | None
) -> dict[str, Any]:
    """One JSON row from every rank's medians: times are the slowest rank's."""
    s = case.shape
    d_row, c_row = fp8_row_bytes(s.hidden), bf16_row_bytes(s.hidden)
    disp = exchange_bytes(case.copies, d_row)
    comb = exchange_bytes(case.copies, c_row, reverse=True)
    local = np.diag(case.copies).astype(float)
    remote = case.copies.sum(axis=1) - np.diag(case.copies)
    row: dict[str, Any] = {
        "model": s.name,
        "mode": case.mode,
        "tokens_per_rank": case.tokens,
        "world": world,
        "hidden": s.hidden,
        "top_k": s.top_k,
        "experts": s.experts,
        "routing": case.routing,
        "dispatch_row_bytes": d_row,
        "combine_row_bytes": c_row,
        "local_copies": float(local.mean()),
        "remote_copies": float(remote.mean()),
        "dispatch_bytes_sent": disp.mean_sent,
        "combine_bytes_sent": comb.mean_sent,
        "dispatch_busiest_bytes": disp.busiest,
        "combine_busiest_bytes": comb.busiest,
        "copies_matrix": case.copies.tolist(),
        "num_sms": num_sms,
    }
    for key in TIME_KEYS:
        vals = [r[key] for r in per_rank if key in r]
        if vals:
            row[key] = max(vals)
            row[key.removesuffix("_s") + "_s_ranks"] = vals
    if case.gemm is not None and "both_s" in row:
        g = case.gemm
        row.update(
            gemm_kind="torch.bmm bf16",
            gemm_experts=g.experts,
            gemm_rows_per_expert=g.rows,
            gemm_k=g.k,
            gemm_n=g.n,
            gemm_flops=g.flops,
        )
        row.update(
            overlap_derived(
                row["gemm_alone_s"], row["exchange_alone_s"], row["both_s"], row["gemm_in_both_s"]
            )
        )
    return row


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + " ".join(str(exc).split())


def run_bench(
    ex: Exchange,
    cfg: BenchConfig,
    out_dir: Path | None,
    *,
    shapes: Sequence[ModelShape] | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every mode, model, routing and size; rank 0 writes ``out_dir/deepep_bench.json`` after
    each mode. Returns the result (complete on rank 0)."""
    world, rank = ex.world, ex.rank
    all_shapes = list(shapes) if shapes is not None else [model_shape(m) for m in cfg.models]
    kept, skipped = shapes_for_world(all_shapes, world)
    result: dict[str, Any] = {
        **ex.info(),
        "world": world,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "config": {
            "iters": cfg.iters,
            "warmup": cfg.warmup,
            "seed": cfg.seed,
            "routings": [routing_name(s) for s in cfg.skews],
            "ll_tokens": list(cfg.ll_tokens),
            "normal_tokens": list(cfg.normal_tokens),
            "num_sms": ex.num_sms,
            "overlap": cfg.overlap,
        },
        "skipped": list(skipped),
        "errors": [],
        "rows": [],
    }
    if rank == 0:
        for line in skipped:
            log(f"skip: {line}")

    def write() -> None:
        result.update(ex.info())  # the probe's refusals grow while it runs
        if rank == 0 and out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / JSON_NAME).write_text(json.dumps(result, indent=2) + "\n")

    index = {s.name: i for i, s in enumerate(all_shapes)}
    for mode in cfg.modes:
        reason = ex.supports(mode)
        if reason is not None:
            result["skipped"].append(f"{mode}: {reason}")
            if rank == 0:
                log(f"skip: {mode}: {reason}")
            continue
        sizes = cfg.ll_tokens if mode == "low_latency" else cfg.normal_tokens
        if not kept or not sizes:
            continue
        try:
            ex.begin_mode(mode, kept, max(sizes))
        except Exception as exc:
            if not cfg.keep_going:
                raise
            result["errors"].append({"mode": mode, "step": "buffer", "error": _one_line(exc)})
            write()
            continue
        for shape in kept:
            _bench_model(ex, cfg, mode, shape, sizes, index[shape.name], result)
            write()
        try:
            ex.end_mode()
        except Exception as exc:  # e.g. DeepEP's destroy barrier on a rank count it refuses
            if not cfg.keep_going:
                raise
            result["errors"].append({"mode": mode, "step": "end", "error": _one_line(exc)})
        write()
    write()
    return result


def _bench_model(
    ex: Exchange,
    cfg: BenchConfig,
    mode: Mode,
    shape: ModelShape,
    sizes: Sequence[int],
    model_index: int,
    result: dict[str, Any],
) -> None:
    world, rank = ex.world, ex.rank
    gemm_n = (cfg.gemm_intermediate or 2 * shape.expert_width) if cfg.overlap else None
    step = "model"
    try:
        ex.begin_model(mode, shape, gemm_n)
        for skew in cfg.skews:
            for tokens in sizes:
                step = f"{routing_name(skew)} T={tokens}"
                topk = [
                    route(
                        tokens,
                        shape.experts,
                        shape.top_k,
                        seed=routing_seed(cfg.seed, r, tokens, model_index, skew),
                        skew=skew,
                    )
                    for r in range(world)
                ]
                copies = copies_matrix(topk, shape.experts, world, dedup=mode == "normal")
                gemm = gemm_shape(shape, tokens, world, cfg.gemm_intermediate) if gemm_n else None
                case = Case(mode, shape, tokens, topk[rank], copies, gemm, routing_name(skew))
                ex.prepare(case)
                mine = measure_case(ex, case, cfg)
                case.state.clear()  # free the device inputs before the next size
                per_rank = ex.gather(mine)
                if rank == 0:
                    num_sms = ex.num_sms if mode == "normal" else None
                    result["rows"].append(make_row(case, per_rank, world, num_sms))
    except Exception as exc:
        if not cfg.keep_going:
            raise
        err = {"mode": mode, "model": shape.name, "step": step, "error": _one_line(exc)}
        result["errors"].append(err)
        if rank == 0:
            print(f"error: {mode} {shape.name} {step}: {err['error']}", file=sys.stderr)


def table(result: dict[str, Any]) -> list[str]:
    """The rows as text (µs, MB on the busiest port, GB/s over it)."""
    lines = [
        f"device={result.get('device')} world={result.get('world')} "
        f"deep_ep={result.get('deep_ep')} torch={result.get('torch')} nccl={result.get('nccl')}",
        f"{'model':<20} {'mode':<11} {'routing':<8} {'T':>6} {'disp µs':>9} {'comb µs':>9} "
        f"{'disp MB':>8} {'disp GB/s':>9} {'comb GB/s':>9} {'hidden':>6} {'sm':>5}",
    ]
    for r in result["rows"]:
        d_bw = r["dispatch_busiest_bytes"] / r["dispatch_s"] / 1e9 if r["dispatch_s"] > 0 else 0
        c_bw = r["combine_busiest_bytes"] / r["combine_s"] / 1e9 if r["combine_s"] > 0 else 0
        hidden = f"{r['hidden_share']:.2f}" if "hidden_share" in r else "-"
        sm = f"{r['sm_share']:.2f}" if "sm_share" in r else "-"
        lines.append(
            f"{r['model']:<20} {r['mode']:<11} {r['routing']:<8} {r['tokens_per_rank']:>6} "
            f"{r['dispatch_s'] * 1e6:>9.1f} {r['combine_s'] * 1e6:>9.1f} "
            f"{r['dispatch_busiest_bytes'] / 1e6:>8.2f} {d_bw:>9.1f} {c_bw:>9.1f} "
            f"{hidden:>6} {sm:>5}"
        )
    for line in result.get("skipped", []):
        lines.append(f"skipped: {line}")
    for e in result.get("errors", []):
        lines.append(f"error: {e}")
    return lines


# --- processes ----------------------------------------------------------------------------------


def _config(args: argparse.Namespace) -> BenchConfig:
    skews = (0.0, *([args.skew] if args.skew else []))
    modes = tuple(m for m in ("normal", "low_latency") if m in args.modes)
    return BenchConfig(
        models=tuple(args.models),
        modes=cast(tuple[Mode, ...], modes),
        ll_tokens=tuple(args.ll_tokens),
        normal_tokens=tuple(args.normal_tokens),
        iters=args.iters,
        warmup=args.warmup,
        seed=args.seed,
        skews=skews,
        overlap=not args.no_overlap,
        gemm_intermediate=args.gemm_intermediate or None,
        keep_going=not args.stop_on_error,
    )


def _worker(rank: int, world: int, init: str, args: argparse.Namespace) -> None:
    import torch.distributed as dist

    no_multicast_env()
    local = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local)
    torch.cuda.set_device(dev)
    kw: dict[str, Any] = {"device_id": dev}
    if init:
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world, **kw)
    else:  # torchrun: env:// rendezvous
        dist.init_process_group("nccl", **kw)
    try:
        group = dist.new_group(list(range(world)))
        ex = DeepEPExchange(group, dev, args.num_sms)
        ex.force = args.one_rank_probe
        result = run_bench(ex, _config(args), Path(args.out))
        if rank == 0:
            print("\n".join(table(result)))
    finally:
        dist.barrier()
        dist.destroy_process_group()


def _unavailable(world: int) -> str | None:
    """Why DeepEP cannot run here (one line), or None."""
    reason = _deep_ep_import_error()
    if reason is not None:
        return (
            f"deep_ep is not importable ({reason}); build DeepEP V1 (calibration/README.md, "
            "'DeepEP exchange') or pass --stand-in"
        )
    n = _gpu_count()
    if n < world:
        need = "one GPU" if world == 1 else f"{world} GPUs of one node"
        return f"{n} CUDA device(s) visible; this needs {need} (or pass --stand-in)"
    return None


def _deep_ep_import_error() -> str | None:
    try:
        import deep_ep  # noqa: F401
    except Exception as exc:
        return _one_line(exc)
    return None


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _stand_in(args: argparse.Namespace) -> int:
    world = args.world or 2
    params = StandInParams(
        latency_s={"low_latency": args.stand_in_latency[0], "normal": args.stand_in_latency[1]},
        bandwidth={"low_latency": args.stand_in_bandwidth[0], "normal": args.stand_in_bandwidth[1]},
        noise=args.stand_in_noise,
        seed=args.seed,
    )
    ex = StandInExchange(world, params)
    result = run_bench(ex, _config(args), Path(args.out))
    print("\n".join(table(result)))
    print(f"wrote {Path(args.out) / JSON_NAME}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m deepinfer_sim.kernels.deepep_bench",
        description=(__doc__ or "").split("\n")[0],
    )
    p.add_argument("--out", default="out/deepep_bench", help="folder for deepep_bench.json")
    p.add_argument("--world", type=int, default=0, help="ranks to spawn (default: every GPU)")
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--ll-tokens", type=int, nargs="+", default=list(LL_TOKENS))
    p.add_argument("--normal-tokens", type=int, nargs="+", default=list(NORMAL_TOKENS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skew", type=float, default=0.0, help="also a skewed routing (S > 0)")
    p.add_argument("--num-sms", type=int, default=DEFAULT_NUM_SMS, help="normal kernels (even)")
    p.add_argument("--no-overlap", action="store_true", help="skip the GEMM overlap runs")
    p.add_argument(
        "--gemm-intermediate", type=int, default=0, help="GEMM N (default 2 × expert width)"
    )
    p.add_argument("--stop-on-error", action="store_true", help="raise instead of recording")
    p.add_argument("--stand-in", action="store_true", help="CPU stand-in, no DeepEP or GPU")
    p.add_argument(
        "--stand-in-latency",
        type=float,
        nargs=2,
        default=[8e-6, 25e-6],
        metavar=("LL", "NORMAL"),
    )
    p.add_argument(
        "--stand-in-bandwidth",
        type=float,
        nargs=2,
        default=[2.2e11, 3.3e11],
        metavar=("LL", "NORMAL"),
        help="bytes/s on the busiest port",
    )
    p.add_argument("--stand-in-noise", type=float, default=0.01)
    p.add_argument(
        "--one-rank-probe",
        action="store_true",
        help="one GPU: run as far as DeepEP allows one rank, recording its refusals",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.num_sms % 2:
        print("error: --num-sms must be even (DeepEP)", file=sys.stderr)
        return 2
    if args.stand_in:
        return _stand_in(args)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.one_rank_probe:
        world = 1
    elif torchrun:
        world = int(os.environ["WORLD_SIZE"])
    else:
        world = args.world or max(2, _gpu_count())
    if world < 2 and not args.one_rank_probe:
        print("error: DeepEP's exchange needs at least 2 ranks (or --stand-in)", file=sys.stderr)
        return 2
    reason = _unavailable(int(os.environ.get("LOCAL_WORLD_SIZE", world)) if torchrun else world)
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    if torchrun:
        _worker(int(os.environ["RANK"]), world, "", args)
        return 0
    spawn_ranks(_worker, world, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
