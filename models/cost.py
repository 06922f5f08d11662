"""StepCost: how long one engine step takes, as plain O(1) functions of numbers.

The simulator asks a pool's StepCost three things: the compute time of one DP rank's share of a
prefill step, the per-rank compute time of a decode step (vectorized over the ranks of a Wide-EP
group), and the all-to-all time of the expert dispatch/combine. Each rank's time is split into a
``dense`` part (attention, dense projections, shared expert: the rank's own tokens) and a ``moe``
part (routed experts: they run in lockstep, so the rank that receives the most routed tokens sets
the pace — the group-mean tokens per rank times the expert-imbalance factor, fed through the
expert kernel's own load→time curve, so a memory-bound step barely feels it). ``compose`` turns
those into a step time:

    step = overhead + max_r dense_r + moe(imbalance · mean_r tokens_r) + exposed all-to-all

where the all-to-all hides behind compute up to ``comm_overlap`` of the compute time (0 unless a
scenario states an overlap it does not model step by step; two-batch overlap, ``compose_tbo``, is
modelled stage by stage) and lasts as long as its busiest end: the rank that sends the most
tokens, or the one whose experts receive imbalance × the mean (``experts_and_exchange``); while
a normal-mode exchange (prefill) runs beside compute it holds a share of the SMs, and the compute
runs that much longer (``AllToAll.sm_share``). An aggregated engine's step, prefill chunks and
decode in one forward, composes the same parts over both (``StepCost.mixed_step``).
:class:`RooflineStepCost` derives the parts from ModelSpec × HardwareSpec with efficiency
factors from YAML; calibrated profiles implement the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field

from .. import fpmath
from ..validation import FrozenModel
from .attention import AttentionCost, TermSum
from .comm import AllToAll, AllToAllParams
from .hardware import HardwareSpec
from .power_limit import SustainedClock
from .spec import ModelSpec, compute_class

Phase = Literal["prefill", "decode", "replay"]
PHASES: tuple[Phase, ...] = ("prefill", "decode", "replay")
Chunk = tuple[int, int]  # (new tokens computed this step, prefix tokens already computed)


class TensorParallelParams(FrozenModel):
    """How a tensor-parallel group's collectives cost (engine and interconnect knobs)."""

    allreduce_latency_s: float = Field(
        2e-6,
        ge=0,
        le=1e-2,
        description="fixed time of one all-reduce inside a scale-up domain, whatever its size "
        "(launch, synchronisation): fitted on the published corpus (planner/analysis/"
        "corpus_fit.py; it sits at the fit's lower bound, 2 µs: the corpus's TP cases want "
        "cheaper collectives than anything else in the model gives)",
    )
    bandwidth_efficiency: float = Field(
        0.7,
        gt=0,
        le=1,
        description="share of the scale-up link's bandwidth per direction an all-reduce reaches",
    )
    allreduces_per_layer: int = Field(
        2,
        ge=0,
        le=8,
        description="all-reduces per layer: after attention's output projection and after the "
        "FFN / MoE (whose combine it is when experts sit on the same GPUs)",
    )
    activation_bytes: float = Field(2.0, gt=0, le=4, description="bytes per reduced value (bf16)")


class StepParams(FrozenModel):
    """Engine-level knobs shared by every cost model (not measured by kernel calibration)."""

    comm_overlap: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of a step's compute that hides its all-to-all in a pool without "
        "two_batch_overlap: 0 by default, since one batch's experts wait for its dispatch and its "
        "next layer for its combine; an engine that overlaps its exchange by means not modelled "
        "step by step states its share here",
    )
    step_overhead_s: float = Field(
        2e-4, ge=0, description="fixed cost per engine step (scheduling, sampling, sync)"
    )
    all_to_all: AllToAllParams = AllToAllParams()
    tensor_parallel: TensorParallelParams = TensorParallelParams()
    sustained_clock: bool = Field(
        True,
        description="slow prefill compute at the power limit as the hardware file's "
        "sustained_clock says (hardware without one: no slowdown)",
    )


class RooflineParams(FrozenModel):
    """Efficiency factors applied to datasheet peaks (the roofline cost model's only knobs)."""

    # the defaults of gemm_efficiency, memory_efficiency and layer_overhead_s are fitted on the
    # published corpus (planner/analysis/corpus_fit.py, docs/validation.md), rounded
    gemm_efficiency: float = Field(0.35, gt=0, le=1, description="fraction of peak FLOP/s in GEMMs")
    attention_efficiency: float = Field(
        0.3, gt=0, le=1, description="fraction of peak FLOP/s in attention kernels"
    )
    memory_efficiency: float = Field(
        0.9,
        gt=0,
        le=1,
        description="fraction of HBM bandwidth (the corpus fit's upper bound: 0.88 is the H200's "
        "measured copy share)",
    )
    layer_overhead_s: float = Field(
        1.75e-4, ge=0, description="per layer per step (launches, synchronisation)"
    )
    attention_dtype: Literal["bf16", "fp8"] = "fp8"
    prefill_attention_dtype: Literal["bf16", "fp8"] | None = Field(
        None, description="prefill attention's dtype (default: attention_dtype)"
    )
    decode_attention_dtype: Literal["bf16", "fp8"] | None = Field(
        None, description="decode attention's dtype (default: attention_dtype)"
    )


def micro_batches(chunks: Sequence[Chunk]) -> tuple[list[Chunk], list[Chunk]]:
    """Two-batch overlap's split of one rank's chunks, as SGLang splits a prefill batch
    (``two_batch_overlap.compute_split_seq_index``): whole chunks, the first micro-batch up to
    and including the one at which the running token count reaches half the total (never the
    last). One chunk is cut in halves instead, the second after the first as its prefix (SGLang
    runs a one-sequence batch without micro-batches; DeepSeek does not say)."""
    if len(chunks) == 1:
        ((n, p),) = chunks
        return ([(n // 2, p)] if n // 2 else []), [(n - n // 2, p + n // 2)]
    half = sum(n for n, _ in chunks) // 2
    done = cut = 0
    for n, _ in chunks[:-1]:
        done += n
        cut += 1
        if done >= half:
            break
    return list(chunks[:cut]), list(chunks[cut:])


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Where one step's time goes (seconds). ``step_s`` = ``overhead_s`` + ``dense_s`` +
    ``experts_s`` + ``a2a_exposed_s``; ``attention_s`` is the part of ``dense_s`` that
    attends to context — a prompt's own earlier tokens and its prefix in prefill, the cached
    context in decode (the slowest rank's dense time minus the same tokens without it) —,
    ``permute_s`` the part of ``experts_s`` that is the engine's permutes around a normal-mode
    exchange, ``tp_comm_s`` the part of ``dense_s`` that is a tensor-parallel group's
    all-reduces, and ``a2a_s`` − ``a2a_exposed_s`` is the all-to-all hidden behind compute
    (``a2a_exposed_s``: what the exchange adds to the step, the SMs it takes from compute — all
    step long for GEMMs on reserved SMs — included)."""

    step_s: float
    dense_s: float
    attention_s: float
    experts_s: float
    a2a_s: float
    a2a_exposed_s: float
    overhead_s: float
    permute_s: float = 0.0
    tp_comm_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "dense": self.dense_s - self.attention_s - self.tp_comm_s,
            "attention": self.attention_s,
            "tp_allreduce": self.tp_comm_s,
            "experts": self.experts_s - self.permute_s,
            "permutes": self.permute_s,
            "a2a_exposed": self.a2a_exposed_s,
            "a2a_hidden": self.a2a_s - self.a2a_exposed_s,
            "overhead": self.overhead_s,
        }


@dataclass(frozen=True, slots=True)
class PoolShape:
    """The parallel shape a StepCost is built for: ``ep`` GPUs per instance (or decode group),
    attention and dense layers ``tp``-way tensor parallel (so ``dp = ep / tp`` data-parallel
    ranks), routed experts ``moe_tp``-way tensor parallel over ``expert_groups = ep / moe_tp``
    expert-parallel groups. DeepSeek's shape is tp = moe_tp = 1: every GPU a rank."""

    ep: int
    redundant_experts_per_gpu: float
    two_batch_overlap: bool = False  # see StepCost.compose_tbo
    tp: int = 1
    moe_tp: int = 1
    reserved_gemm_sms: bool = False  # GEMMs on the SMs the exchange leaves (compose_tbo)

    def __post_init__(self) -> None:
        for name in ("tp", "moe_tp"):
            width = getattr(self, name)
            if width < 1 or self.ep % width:
                raise ValueError(f"{name}={width} must divide the pool's {self.ep} GPUs")

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each holds its own sequences, on ``tp`` GPUs."""
        return self.ep // self.tp

    @property
    def expert_groups(self) -> int:
        """Expert-parallel groups the routed experts are spread over (``moe_tp`` GPUs each)."""
        return self.ep // self.moe_tp

    @property
    def replicated_tokens(self) -> bool:
        """One data-parallel rank on all GPUs: every GPU holds every token, so the experts need
        no all-to-all (their combine is the layer's all-reduce)."""
        return self.dp == 1 and self.ep > 1


class StepCost(ABC):
    """Step-time model of one pool: one hardware kind at one EP width."""

    model: ModelSpec  # what one GPU of a rank holds and computes
    shape: PoolShape
    step_overhead_s: float
    comm_overlap: float
    sustained_clock: SustainedClock | None = None  # prefill compute at the power limit
    # the share of the last prefill_step's time its GPUs computed (an eager engine's host-bound
    # step leaves them idle for the rest): what the power limiter sees of it
    prefill_busy_share: float = 1.0
    _a2a: AllToAll  # the pool's expert-parallel exchange

    @abstractmethod
    def prefill_dense(self, chunks: Sequence[Chunk]) -> float:
        """Non-expert time of one DP rank computing these (new tokens, computed prefix) chunks."""

    @abstractmethod
    def prefill_dense_without_attention(self, chunks: Sequence[Chunk]) -> float:
        """:meth:`prefill_dense` less attention: the chunks' tokens with no attention among
        themselves or over their prefixes (the breakdown's attention is the difference)."""

    @abstractmethod
    def replay_dense(self, chunks: Sequence[Chunk]) -> float:
        """Non-expert time of one DP rank running SWA-replay chunks through the replay-only
        (decoder) layers; 0 for models without such layers."""

    @abstractmethod
    def decode_dense(self, batch: np.ndarray, kv_tokens: np.ndarray, verify: float) -> np.ndarray:
        """Per-rank non-expert time of a decode step: ``batch`` sequences holding ``kv_tokens``
        context tokens in total on each rank, ``verify`` tokens computed per sequence."""

    @abstractmethod
    def moe_s(self, tokens_per_rank: float, phase: Phase) -> float:
        """Routed-expert time of one rank that receives this many tokens (per MoE layer)."""

    def _set_power_limit(self, hw: HardwareSpec, step: StepParams) -> None:
        """The hardware's clock at its power limit (:mod:`.power_limit`), unless switched off."""
        self.sustained_clock = hw.sustained_clock if step.sustained_clock else None

    @property
    def sustained_slowdown(self) -> float:
        """Prefill compute's slowdown when steps run back to back (steady points); 1 where the
        hardware states none or the scenario switched it off."""
        clock = self.sustained_clock
        return clock.slowdown if clock is not None else 1.0

    def _set_tensor_parallel(self, model: ModelSpec, hw: HardwareSpec, step: StepParams) -> None:
        """The all-reduces of a ``shape.tp``-wide group, per layer: α + β·tokens, a ring's
        2(tp − 1)/tp of the activations over the scale-up link (zero at tp = 1)."""
        tp, p = self.shape.tp, step.tensor_parallel
        self._tp_layers = {
            "prefill": model.prefill_layers,
            "decode": model.n_layers,
            "replay": model.replay_only_layers,
        }
        if tp == 1:
            self._tp_alpha = self._tp_beta = 0.0
            return
        link = hw.scaleup.bytes_per_s_per_dir * p.bandwidth_efficiency
        self._tp_alpha = p.allreduces_per_layer * p.allreduce_latency_s
        ring = 2.0 * (tp - 1) / tp
        self._tp_beta = p.allreduces_per_layer * ring * model.hidden * p.activation_bytes / link

    def tp_comm_s(self, tokens: float, phase: Phase) -> float:
        """A tensor-parallel group's all-reduces over the phase's layers for ``tokens`` tokens
        of one data-parallel rank (0 without tensor parallelism or tokens)."""
        if tokens <= 0 or self.shape.tp == 1:
            return 0.0
        return self._tp_layers[phase] * (self._tp_alpha + self._tp_beta * tokens)

    def a2a_s(self, tokens_per_rank: float, phase: Phase) -> float:
        """Dispatch + combine time over all MoE layers for ``tokens_per_rank`` tokens per rank."""
        return self._a2a.time(tokens_per_rank, phase)

    @property
    def dispatch_share(self) -> float:
        """The dispatch's share of one exchange's time (by bytes)."""
        return self._a2a.dispatch_share

    def experts_and_exchange(
        self, sent_max: float, sent_sum: float, imbalance: float, phase: Phase
    ) -> tuple[float, float]:
        """(routed-expert time, all-to-all time) of a step whose ranks send ``sent_sum`` tokens,
        the busiest ``sent_max``: the experts run at the hottest rank's load, ``imbalance`` × the
        mean, with the engine's permutes around a normal-mode exchange (:meth:`AllToAll.permute_s`),
        and the exchange lasts as long as its busiest end — that rank receiving, or the busiest
        sender sending."""
        received = self._received(sent_sum, imbalance)
        if self.shape.replicated_tokens:  # every GPU holds every token: no exchange
            return self.moe_s(received, phase), 0.0
        experts = self.moe_s(received, phase) + self._a2a.permute_s(received, phase)
        # a tensor-parallel rank's GPUs each send their share of its tokens
        return experts, self.a2a_s(max(sent_max / self.shape.tp, received), phase)

    def _received(self, sent_sum: float, imbalance: float) -> float:
        """Tokens the hottest expert group receives when the ranks send ``sent_sum`` in all: the
        expert imbalance (slowest group / mean) is 1 where one group holds every expert."""
        groups = self.shape.expert_groups
        return (imbalance if groups > 1 else 1.0) * sent_sum / groups

    def _permute_s(self, sent_sum: float, imbalance: float, phase: Phase) -> float:
        """The engine's permutes around a normal-mode exchange (none without an exchange)."""
        if self.shape.replicated_tokens:
            return 0.0
        return self._a2a.permute_s(self._received(sent_sum, imbalance), phase)

    def compose(self, dense_max: float, moe: float, comm: float, phase: Phase) -> float:
        """Compute, then the all-to-all beyond what ``comm_overlap`` of the compute hides; the
        compute that runs beside the exchange loses the exchange's share of the SMs for as long
        as it runs (DeepEP's normal kernels; the low-latency ones hold none)."""
        compute = dense_max + moe
        hidden = min(comm, self.comm_overlap * compute)
        stolen = self._a2a.sm_share(phase) * hidden
        return self.step_overhead_s + compute + (comm - hidden) + stolen

    def compose_tbo(
        self,
        dense_half: float,
        moe_half: float,
        comm_half: float,
        phase: Phase,
        gemm: tuple[float, float] | None = None,
    ) -> float:
        """Two-batch overlap: the step runs as two micro-batches of half the load (fixed costs
        such as weight reads are paid twice — the price at small batches). A layer is attention
        (a), dispatch (d), experts (m), combine (e) for each; micro-batch B runs one stage behind
        A, so each stage of one overlaps a stage of the other and lasts the longer of the two:
        max(a, e') + max(d, a') + max(m, d') + max(e, m') per layer — A's dispatch under B's
        attention, A's experts under B's dispatch, A's combine under B's experts, B's combine
        under A's next attention. It is 2·(a + m) with no communication and 2·(d + e) with no
        compute, and longer than 2·max(a + m, d + e) whenever a stage of one stream is not the
        same length as the stage it hides under. An exchange that holds a share s of the SMs
        slows the compute beside it: a stage of compute c under exchange x lasts max(x, c + s·x).

        A pool whose engine reserves the exchange's SMs for the whole step
        (``PoolShape.reserved_gemm_sms``: SGLang runs every DeepGEMM call of an overlapped
        prefill on the SMs DeepEP's leave) runs the GEMM part g of each stage's compute
        (``gemm``: of a and of m) on 1 − s of the SMs throughout, and the rest o loses its share
        only beside the exchange: max(x, g / (1 − s) + o + s·min(x, o))."""
        a, m = dense_half, moe_half
        d = self.dispatch_share * comm_half
        e = comm_half - d
        s = self._a2a.sm_share(phase)  # each stage: max(exchange x, compute c + s·x)
        if gemm is None or s == 0.0 or not self.shape.reserved_gemm_sms:
            return (
                self.step_overhead_s
                + max(e, a + s * e)
                + max(d, a + s * d)
                + max(d, m + s * d)
                + max(e, m + s * e)
            )
        ga, gm = gemm
        oa, om = a - ga, m - gm
        ga, gm = ga / (1.0 - s), gm / (1.0 - s)
        return (
            self.step_overhead_s
            + max(e, ga + oa + s * min(e, oa))
            + max(d, ga + oa + s * min(d, oa))
            + max(d, gm + om + s * min(d, om))
            + max(e, gm + om + s * min(e, om))
        )

    def compose_step(
        self,
        dense: float,
        moe: float,
        comm: float,
        phase: Phase,
        gemm: tuple[float, float] | None = None,
    ) -> float:
        """The step from its parts — of one micro-batch under two-batch overlap; ``gemm``: the
        GEMM parts of ``dense`` and ``moe`` (:meth:`compose_tbo`; None: not split)."""
        if self.shape.two_batch_overlap:
            return self.compose_tbo(dense, moe, comm, phase, gemm)
        return self.compose(dense, moe, comm, phase)

    def breakdown(
        self,
        dense_max: float,
        context_free: float,
        moe: float,
        comm: float,
        phase: Phase,
        permute: float = 0.0,
        tp_comm: float = 0.0,
    ) -> StepBreakdown:
        """The parts of ``compose(dense_max, moe, comm)`` — with two-batch overlap, arguments of
        one micro-batch and parts of both; ``context_free``: the slowest rank's dense time with
        no attention (so dense_max − context_free is attention); ``permute``: the engine's
        permutes, part of ``moe``; ``tp_comm``: the all-reduces, part of ``dense_max`` (and of
        ``context_free``)."""
        step = self.compose_step(dense_max, moe, comm, phase, (context_free, moe - permute))
        if self.shape.two_batch_overlap:
            dense_max, context_free, moe, comm, permute, tp_comm = (
                2 * x for x in (dense_max, context_free, moe, comm, permute, tp_comm)
            )
        exposed = max(0.0, step - self.step_overhead_s - dense_max - moe)
        return StepBreakdown(
            step_s=step,
            dense_s=dense_max,
            attention_s=max(0.0, dense_max - context_free),
            experts_s=moe,
            a2a_s=comm,
            a2a_exposed_s=exposed,
            overhead_s=self.step_overhead_s,
            permute_s=permute,
            tp_comm_s=tp_comm,
        )

    def decode_breakdown(
        self, batch: np.ndarray, kv_tokens: np.ndarray, verify: float, imbalance: float = 1.0
    ) -> StepBreakdown:
        """:meth:`decode_step`'s parts (off the hot path: reports, ``deepinfer-sim cost``)."""
        share = 0.5 if self.shape.two_batch_overlap else 1.0  # one micro-batch's load
        batch = np.asarray(batch, dtype=float) * share
        dense = self.decode_dense(batch, np.asarray(kv_tokens, dtype=float) * share, verify)
        i = int(np.argmax(dense))
        bare = float(self.decode_dense(batch[i : i + 1], np.zeros(1), verify)[0])
        tp_comm = self.tp_comm_s(float(batch.max()) * verify, "decode")
        moe, comm = self.experts_and_exchange(
            float(batch.max()) * verify, float(batch.sum()) * verify, imbalance, "decode"
        )
        return self.breakdown(
            float(dense[i]) + tp_comm, bare + tp_comm, moe, comm, "decode", tp_comm=tp_comm
        )

    def prefill_breakdown(
        self, ranks: Sequence[Sequence[Chunk]], imbalance: float = 1.0, slowdown: float = 1.0
    ) -> StepBreakdown:
        """:meth:`prefill_step`'s parts for ranks computing these chunks (no SWA replay)."""
        dense, moe, comm, permute, bare = self._prefill_parts(
            ranks, imbalance, bare=True, slowdown=slowdown
        )
        share = 0.5 if self.shape.two_batch_overlap else 1.0
        tokens_max = max((float(sum(n for n, _ in c)) for c in ranks), default=0.0)
        tp_comm = self.tp_comm_s(share * tokens_max, "prefill")
        return self.breakdown(dense, bare, moe, comm, "prefill", permute, tp_comm)

    def _prefill_parts(
        self,
        ranks: Sequence[Sequence[Chunk]],
        imbalance: float,
        replay: Sequence[Sequence[Chunk]] = (),
        bare: bool = False,
        slowdown: float = 1.0,
    ) -> tuple[float, float, float, float, float]:
        """(slowest rank's dense time, routed experts, all-to-all, the engine's permutes — part
        of the routed experts —, and with ``bare`` the slowest rank's dense time without
        attention, else 0) of a prefill step — of one of its two micro-batches (their mean)
        under two-batch overlap. ``slowdown`` multiplies the compute (the GPU's clock at its
        power limit: :mod:`.power_limit`), not the all-reduces or the exchange."""
        tbo = self.shape.two_batch_overlap
        prefill_dense = self.prefill_dense
        no_attention = self.prefill_dense_without_attention
        dense_max = 0.0
        bare_max = 0.0
        tokens_max = 0.0
        tokens_sum = 0.0
        replay_sum = 0.0
        replay_max = 0.0
        for i, chunks in enumerate(ranks):
            rep = replay[i] if i < len(replay) else ()
            if not chunks and not rep:
                continue
            if tbo:
                a, b = micro_batches(chunks)
                dense = 0.5 * (prefill_dense(a) + prefill_dense(b)) if chunks else 0.0
                if bare:
                    plain = 0.5 * (no_attention(a) + no_attention(b)) if chunks else 0.0
            else:
                dense = prefill_dense(chunks) if chunks else 0.0
                if bare:
                    plain = no_attention(chunks) if chunks else 0.0
            if rep:
                if tbo:
                    ra, rb = micro_batches(rep)
                    rest = 0.5 * (self.replay_dense(ra) + self.replay_dense(rb))
                else:
                    rest = self.replay_dense(rep)
                dense += rest
                if bare:
                    plain += rest
                r = float(sum(n for n, _ in rep))
                replay_sum += r
                replay_max = max(replay_max, r)
            if bare:
                bare_max = max(bare_max, plain)
            dense_max = max(dense_max, dense)
            tokens = float(sum(n for n, _ in chunks))
            tokens_sum += tokens
            tokens_max = max(tokens_max, tokens)
        share = 0.5 if tbo else 1.0
        moe, comm = self.experts_and_exchange(
            share * tokens_max, share * tokens_sum, imbalance, "prefill"
        )
        permute = self._permute_s(share * tokens_sum, imbalance, "prefill")
        if replay_sum:
            r_moe, r_comm = self.experts_and_exchange(
                share * replay_max, share * replay_sum, imbalance, "replay"
            )
            moe, comm = moe + r_moe, comm + r_comm
            permute += self._permute_s(share * replay_sum, imbalance, "replay")
        if slowdown != 1.0:
            dense_max, bare_max = dense_max * slowdown, bare_max * slowdown
            moe, permute = moe * slowdown, permute * slowdown
        tp = self.tp_comm_s(share * tokens_max, "prefill")
        dense_max += tp
        bare_max += tp
        if replay_sum:
            tp = self.tp_comm_s(share * replay_max, "replay")
            dense_max += tp
            bare_max += tp
        return dense_max, moe, comm, permute, (bare_max if bare else 0.0)

    def prefill_step(
        self,
        ranks: Sequence[Sequence[Chunk]],
        imbalance: float = 1.0,
        replay: Sequence[Sequence[Chunk]] = (),
        slowdown: float = 1.0,
    ) -> float:
        """Step time of a prefill instance whose DP ranks compute the given chunks through the
        prefill layers and (``replay``, per rank) SWA-replay chunks through the decoder layers,
        their compute ``slowdown`` times the calibration's (the clock at the power limit)."""
        reserved = self.shape.reserved_gemm_sms
        dense, moe, comm, permute, bare = self._prefill_parts(
            ranks, imbalance, replay, reserved, slowdown
        )
        gemm = (bare, moe - permute) if reserved else None
        return self.compose_step(dense, moe, comm, "prefill", gemm)

    def prefill_quadratic(self, imbalance: float = 1.0) -> tuple[float, float, float, float]:
        """(a, b, c, d) of t(n, p) ≈ a + b·n + c·n·p + d·n², the step time of a balanced step
        (every DP rank computing n new tokens after p), fitted once by relative least squares
        over n 64..32,768 and p 0..262,144. The chunk scheduler solves it for n in closed form."""
        if getattr(self, "_quadratic", None) is None:
            # whole token counts on geometric grids (powers of 2 for n; 1024·256^(i/6) for p)
            ns = [64 << i for i in range(10)]
            ps = [0] + [round(1024 * fpmath.power(256.0, i / 6)) for i in range(7)]
            rows, ts = [], []
            for n in ns:
                for p in ps:
                    rank = [(n, p)]
                    ts.append(self.prefill_step([rank] * self.shape.dp, imbalance))
                    rows.append([1.0, float(n), float(n * p), float(n * n)])
            scale = [max(col) for col in zip(*rows, strict=True)]
            scaled = [
                [v / sc / t for v, sc in zip(row, scale, strict=True)]
                for row, t in zip(rows, ts, strict=True)
            ]
            x = fpmath.nonnegative_least_squares(scaled, [1.0] * len(ts))
            a, b, c, d = (v / sc for v, sc in zip(x, scale, strict=True))
            self._quadratic = (a, b, c, d)
        return self._quadratic

    def decode_step(
        self, batch: np.ndarray, kv_tokens: np.ndarray, verify: float, imbalance: float = 1.0
    ) -> float:
        """Lockstep step time of a Wide-EP decode group: the slowest rank sets the pace."""
        if self.shape.two_batch_overlap:
            batch, kv_tokens = batch * 0.5, kv_tokens * 0.5
        dense_max = float(self.decode_dense(batch, kv_tokens, verify).max())
        dense_max += self.tp_comm_s(float(batch.max()) * verify, "decode")
        moe, comm = self.experts_and_exchange(
            float(batch.max()) * verify, float(batch.sum()) * verify, imbalance, "decode"
        )
        return self.compose_step(dense_max, moe, comm, "decode")

    def decode_step_packed(self, load: np.ndarray, imbalance: float = 1.0) -> float:
        """The decode step from per-rank rows ``load = [batch; kv_tokens; tokens; kv-weighted
        tokens]``: tokens = Σ (1 + verify) over the rank's sequences, and the last row weights
        each computed token by its sequence's context (its attention work)."""
        if self.shape.two_batch_overlap:
            load = load * 0.5
        batch, kv, tokens = load[0], load[1], load[2]
        dense_max = self.decode_dense_max(batch, kv, tokens)
        dense_max += self.tp_comm_s(float(tokens.max()), "decode")
        moe, comm = self.experts_and_exchange(
            float(tokens.max()), float(tokens.sum()), imbalance, "decode"
        )
        return self.compose_step(dense_max, moe, comm, "decode")

    def decode_dense_max(self, batch: np.ndarray, kv: np.ndarray, tokens: np.ndarray) -> float:
        """The slowest rank's :meth:`decode_dense` when each rank computes ``tokens`` tokens for
        its ``batch`` sequences (verify = tokens / batch; 1 on an empty rank)."""
        verify = np.divide(tokens, batch, out=np.ones_like(tokens), where=batch > 0)
        return float(self.decode_dense(batch, kv, verify).max())

    def mixed_step(
        self,
        chunks: Sequence[Sequence[Chunk]],
        load: np.ndarray,
        imbalance: float = 1.0,
        replay: Sequence[Sequence[Chunk]] = (),
    ) -> float:
        """Step time of an aggregated instance whose DP ranks run prefill ``chunks`` (and, per
        rank, ``replay`` chunks through the replay-only layers) in the same forward as the
        decode load ``load`` (per-rank rows as :meth:`decode_step_packed` reads them): chunked
        prefill as vLLM and SGLang run it.

        With one side empty it is that side's step, exactly (:meth:`decode_step_packed`,
        :meth:`prefill_step`). Otherwise, per rank, the dense time is the prefill side's (as
        :meth:`prefill_step` charges it) plus the decode side's (:meth:`decode_dense`) less what
        one forward pays once — the decode side's idle-rank floor (weights read, per-layer
        launches), at most the prefill side's own time, so adding a chunk never makes a step
        shorter; a tensor-parallel rank all-reduces all its tokens; the routed experts and the
        exchange carry every token of the step (decode tokens ride with the chunks through the
        prefill layers and with the replay segments through the replay-only layers), exchanged
        as prefill's are (a step that carries a prompt runs the normal-mode kernels). Two-batch
        overlap halves both sides. The parts compose as every step's do (:meth:`compose_step`,
        the prefill phase)."""
        if not (any(chunks) or any(replay)):
            return self.decode_step_packed(load, imbalance)
        if not load[0].any():
            return self.prefill_step(chunks, imbalance, replay)
        tbo = self.shape.two_batch_overlap
        share = 0.5 if tbo else 1.0
        if tbo:
            load = load * 0.5
        batch, kv, tokens = load[0], load[1], load[2]
        verify = np.divide(tokens, batch, out=np.ones_like(tokens), where=batch > 0)
        decode = self.decode_dense(batch, kv, verify)
        floor = float(self.decode_dense(np.zeros(1), np.zeros(1), 1.0)[0])
        dense_max = 0.0
        # tokens of each rank through the prefill layers (chunks + decode) and through the
        # replay-only layers (replay segments + decode)
        pre_max = pre_sum = rep_max = rep_sum = 0.0
        for i in range(batch.size):
            ch = chunks[i] if i < len(chunks) else ()
            rep = replay[i] if i < len(replay) else ()
            side = 0.0
            if ch:
                if tbo:
                    a, b = micro_batches(ch)
                    side = 0.5 * (self.prefill_dense(a) + self.prefill_dense(b))
                else:
                    side = self.prefill_dense(ch)
            if rep:
                if tbo:
                    ra, rb = micro_batches(rep)
                    side += 0.5 * (self.replay_dense(ra) + self.replay_dense(rb))
                else:
                    side += self.replay_dense(rep)
            dense = float(decode[i]) + side - min(floor, side)
            dense_max = max(dense_max, dense)
            dec = float(tokens[i])
            pre = share * float(sum(n for n, _ in ch)) + dec
            rp = share * float(sum(n for n, _ in rep)) + dec
            pre_sum += pre
            rep_sum += rp
            pre_max = max(pre_max, pre)
            rep_max = max(rep_max, rp)
        dense_max += self.tp_comm_s(pre_max, "prefill")
        moe, comm = self.experts_and_exchange(pre_max, pre_sum, imbalance, "prefill")
        if self.model.replay_only_layers:
            dense_max += self.tp_comm_s(rep_max, "replay")
            r_moe, r_comm = self.experts_and_exchange(rep_max, rep_sum, imbalance, "replay")
            moe, comm = moe + r_moe, comm + r_comm
        return self.compose_step(dense_max, moe, comm, "prefill")


class RooflineStepCost(StepCost):
    """max(FLOPs / effective peak, bytes / effective bandwidth), per part, from the specs."""

    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        shape: PoolShape,
        params: RooflineParams,
        step: StepParams | None = None,
    ) -> None:
        step = step or StepParams()
        self.model, self.hw, self.shape, self.params = model, hw, shape, params
        self.step_overhead_s = step.step_overhead_s
        self.comm_overlap = step.comm_overlap
        self.attn = AttentionCost.of(model)
        eff = params.gemm_efficiency
        dense_rate = hw.flops(compute_class(model.precision.dense)) * eff
        self._expert_rate = hw.flops(compute_class(model.precision.experts)) * eff

        def attention_rate(dtype: str | None) -> float:
            return hw.flops(dtype or params.attention_dtype) * params.attention_efficiency

        attn_rate = attention_rate(params.decode_attention_dtype)
        self._attn_rate = attention_rate(params.prefill_attention_dtype)  # prefill and replay
        bw = hw.hbm_bytes_per_s * params.memory_efficiency
        self._bw = bw
        groups, red = shape.expert_groups, shape.redundant_experts_per_gpu
        self._expert_flops = {ph: model.linear_flops_per_token(ph)[1] for ph in PHASES}
        self._local_experts = model.experts_per_gpu(groups, red)
        self._top_k = model.moe.top_k
        # weights of one local expert through every MoE layer of the phase, per second
        self._expert_mem_s = {
            ph: model.expert_bytes * model.moe_layer_count(ph) / bw for ph in PHASES
        }
        self._overhead = {
            "prefill": params.layer_overhead_s * model.prefill_layers,
            "decode": params.layer_overhead_s * model.n_layers,
            "replay": params.layer_overhead_s * model.replay_only_layers,
        }
        # replay (decoder layers in prefill): as prefill, over the replay-only layers
        self._r_tok = model.linear_flops_per_token("replay")[0] / dense_rate
        self._r_mem0 = model.dense_weight_bytes * model.replay_only_layers / model.n_layers / bw
        # prefill, per rank: compute = tokens·p_tok + attention FLOPs / attn_rate;
        # memory = p_mem0 + tokens·p_mem_tok (dense weights of the prefill layers + KV written)
        self._p_tok = model.linear_flops_per_token("prefill")[0] / dense_rate
        self._p_prefix = self.attn.prefix_flops / dense_rate
        prefill_share = model.prefill_layers / model.n_layers
        self._p_mem0 = model.dense_weight_bytes * prefill_share / bw
        self._p_mem_tok = model.kv_bytes_per_token() / bw
        # decode, per rank: compute = v·(batch·c_batch + kv·c_kv)
        #                  memory  = m0 + batch·m_batch + kv·m_kv
        flops_a, flops_b = self.attn.decode_flops.linear()
        bytes_a, bytes_b = self.attn.decode_bytes.linear()
        self._c_batch = model.linear_flops_per_token("decode")[0] / dense_rate + flops_a / attn_rate
        self._c_kv = flops_b / attn_rate
        self._m0 = model.dense_weight_bytes / bw
        self._m_batch = bytes_a / bw
        self._m_kv = bytes_b / bw
        self._a2a = AllToAll(model, hw, shape.ep, step.all_to_all)
        self._set_tensor_parallel(model, hw, step)
        self._set_power_limit(hw, step)

    def moe_s(self, tokens_per_rank: float, phase: Phase) -> float:
        """max(FLOPs, weights of the experts the tokens reach): R = tokens·top_k token-expert
        pairs reach E·(1 − e^(−R/E)) of the E local experts (uniform routing), so a small batch
        reads a few experts' weights, not all of them."""
        if tokens_per_rank <= 0:
            return 0.0
        flops = tokens_per_rank * self._expert_flops[phase]
        e = self._local_experts
        active = e * (1.0 - fpmath.exp(-tokens_per_rank * self._top_k / e))
        return max(flops / self._expert_rate, active * self._expert_mem_s[phase])

    def _chunks_compute(
        self, chunks: Sequence[Chunk], attn: TermSum, per_token: float, per_prefix: float = 0.0
    ) -> tuple[float, float]:
        """(tokens, compute seconds) of chunks through one set of layers; ``per_prefix``: dense
        FLOPs per chunk per prefix token (MLA's up-projection of the prefix)."""
        tokens = 0.0
        flops = 0.0
        prefix = 0.0
        for n, p in chunks:
            tokens += n
            flops += attn.chunk(n, p)
            prefix += p
        return tokens, tokens * per_token + flops / self._attn_rate + prefix * per_prefix

    def prefill_dense(self, chunks: Sequence[Chunk]) -> float:
        tokens, compute = self._chunks_compute(
            chunks, self.attn.prefill_flops, self._p_tok, self._p_prefix
        )
        if tokens <= 0:
            return 0.0
        memory = self._p_mem0 + tokens * self._p_mem_tok
        return max(compute, memory) + self._overhead["prefill"]

    def prefill_dense_without_attention(self, chunks: Sequence[Chunk]) -> float:
        tokens = float(sum(n for n, _ in chunks))
        if tokens <= 0:
            return 0.0
        memory = self._p_mem0 + tokens * self._p_mem_tok
        return max(tokens * self._p_tok, memory) + self._overhead["prefill"]

    def replay_dense(self, chunks: Sequence[Chunk]) -> float:
        if not self.model.replay_only_layers:
            return 0.0
        tokens, compute = self._chunks_compute(chunks, self.attn.replay_flops, self._r_tok)
        if tokens <= 0:
            return 0.0
        return max(compute, self._r_mem0) + self._overhead["replay"]

    def decode_dense(self, batch: np.ndarray, kv_tokens: np.ndarray, verify: float) -> np.ndarray:
        # Hot path (once per decode step, vectorized over the group's ranks). An idle rank shows
        # its memory floor, which never exceeds a busy rank's time, so the max needs no mask.
        compute = batch * (verify * self._c_batch) + kv_tokens * (verify * self._c_kv)
        memory = batch * self._m_batch + kv_tokens * self._m_kv
        return np.maximum(compute, memory + self._m0) + self._overhead["decode"]

    def decode_step_packed(self, load: np.ndarray, imbalance: float = 1.0) -> float:
        # Hot path (once per decode step): every rank's compute and memory time, the slowest
        # of each and the busiest rank's tokens. Written out, not as a matrix product: BLAS
        # kernels differ per CPU in their last bits (deepinfer_sim.fpmath).
        if self.shape.two_batch_overlap:
            load = load * 0.5
        compute = (load[2] * self._c_batch + load[3] * self._c_kv).max()
        memory = (load[0] * self._m_batch + load[1] * self._m_kv).max() + self._m0
        tokens_max = load[2].max()
        dense_max = max(compute, memory) + self._overhead["decode"]
        dense_max += self.tp_comm_s(float(tokens_max), "decode")
        moe, comm = self.experts_and_exchange(
            float(tokens_max), float(load[2].sum()), imbalance, "decode"
        )
        return self.compose_step(dense_max, moe, comm, "decode")
