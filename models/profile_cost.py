"""ProfileStepCost: the StepCost of a calibrated profile (measured or derived).

A profile holds, per model, per-layer fits for each attention kind plus the routed-expert and
all-to-all models (see ``models/profile.py``); this class takes one model's coefficients on
one hardware (``Profile.coefs(model, hw)``) and composes them over the model's layer counts
once, at construction, into a handful of coefficients, so every call on the hot path is O(1):

    prefill_dense(chunks) = A + Σ_i (B·n_i + C·n_i·p_i + D·n_i² + E·p_i
                                     + [p_i > 0]·(F + G·n_i + Σ_w C_w·W_w(n_i)·p_i))
                            (sums over layers; C_w the n·p terms of kinds whose fits count n in
                            waves W_w of their attention's query tiles, one per wave shape)
    decode_dense(rank)    = Σ_kinds count·(a + max(w, b·τ·⌈T/τ⌉) + c·K + d·B + e·v·K)
                            (vectorized over ranks; τ = 1: T as is)
    moe_s(tokens)         = moe_layers · (a + ((e·E_act)^k + (f·rows)^k)^(1/k)),
                            R = tokens·top_k, E_act = E·(1 − exp(−R/E)), rows = R (exp form)
                            or τ·E_act·⌈R/(E_act·τ)⌉ (tile form); k = 1: a + e·E_act + f·rows
                            (weight reads and GEMMs add up), k > 1: they overlap

Fits are CUDA-graph replays where capture worked (the GPU's own time: production engines graph
their decode step and run prefill at sizes where launches hide behind the GPU);
``eager=True`` adds the measured per-layer launch overhead back, for comparing with an eager
engine such as ``kernels/engine.py``, except in the phases that engine replayed as CUDA graphs
(``engine_graphs``: decode; ``engine_prefill_graph_tokens``: prefill steps up to that size,
costed as the graphed kernel models plus the engine's ``prefill_graph_step_s``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import fpmath
from ..errors import ConfigError
from ..jit import COMPILED, exp, njit, pairwise_sum, power, sum_block
from .comm import AllToAll
from .cost import PHASES, Chunk, Phase, PoolShape, StepCost, StepParams
from .hardware import HardwareSpec
from .profile import HardwareCoefs, gemm_cost, tiled_verify, wave_rows
from .spec import ModelSpec

# a prefill side's per-layer fits summed over its layers: (A, B, C, D, E, F, G) and, for kinds
# whose n·p term counts whole waves, (C summed, query rows per tile, tiles per wave) per shape
DenseSums = tuple[tuple[float, ...], tuple[tuple[float, int, float], ...]]


class ProfileStepCost(StepCost):
    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        shape: PoolShape,
        coefs: HardwareCoefs,
        step: StepParams | None = None,
        profile_name: str = "profile",
        eager: bool = False,
    ) -> None:
        step = step or StepParams()
        self.model, self.hw, self.shape, self.coefs = model, hw, shape, coefs
        self.step_overhead_s = step.step_overhead_s
        self.comm_overlap = step.comm_overlap

        def coef_of(table: Mapping[Any, Any], kind: str, phase: str) -> Any:
            if kind not in table:
                raise ConfigError(
                    "",
                    f"profile {profile_name!r} has no {phase} fit for {kind!r} attention layers "
                    f"(model {model.name} needs them)",
                )
            return table[kind]

        host = coefs.host_overhead_s
        eng = coefs.engine_overhead
        # eager prefill, overlap form: host launches run while the GPU works (see prefill_step)
        overlap = eager and (
            eng.prefill_host_s + eng.prefill_host_per_seq_s + eng.prefill_host_per_token_s > 0
        )
        self._pre_host = (
            (
                eng.prefill_host_s,
                eng.prefill_host_per_seq_s,
                eng.prefill_host_per_token_s,
                eng.prefill_host_exposed,
            )
            if overlap
            else None
        )
        self.prefill_loop_s = eng.prefill_loop_s if eager else 0.0
        # the engine's prefill steps up to this size are CUDA graphs: the graphed kernel models
        # (no launch gaps, no host overlap) plus a constant per step
        self._graph_tokens = coefs.engine_prefill_graph_tokens if eager else 0
        self._graphed: ProfileStepCost | None = (
            ProfileStepCost(model, hw, shape, coefs, step, profile_name)
            if self._graph_tokens
            else None
        )
        self._graph_step_s = eng.prefill_graph_step_s
        self._graph_seq_s = eng.prefill_graph_per_seq_s
        self._graph_token_s = eng.prefill_graph_per_token_s

        def layer_sum(groups: list[Any], per_layer_host: float) -> DenseSums:
            A = per_layer_host * sum(g.count for g in groups) if eager else 0.0
            B = C = D = E = F = G = 0.0
            waves: dict[tuple[int, float], float] = {}  # (tile, tiles) -> C summed
            for g in groups:
                c = coef_of(coefs.prefill, g.attention, "prefill")
                A += g.count * c.a
                B += g.count * c.b
                if c.wave_tiles > 0:
                    key = (c.wave_tile, c.wave_tiles)
                    waves[key] = waves.get(key, 0.0) + g.count * c.c
                else:
                    C += g.count * c.c
                D += g.count * c.d
                E += g.count * c.e
                F += g.count * c.f
                G += g.count * c.g
            return (A, B, C, D, E, F, G), tuple((cw, t, k) for (t, k), cw in waves.items())

        pre_host = 0.0 if overlap else host.prefill
        self._pre = layer_sum([g for g in model.layer_groups if g.in_prefill], pre_host)
        replay_groups = [g for g in model.layer_groups if not g.in_prefill]
        self._rep = layer_sum(replay_groups, pre_host) if replay_groups else None
        # decode: layer counts by kind, then per kind (count, w, b, τ, staircase) for the max()
        # term; the linear terms of all kinds fold into six sums
        counts: dict[str, int] = {}
        for g in model.layer_groups:
            counts[g.attention] = counts.get(g.attention, 0) + g.count
        self._dec = []
        # an eager engine (like kernels/engine.py) also pays the launch gaps that CUDA graphs hide
        # (unless that engine replays its decode steps as CUDA graphs: then only prefill pays)
        graphed_decode = coefs.engine_graphs
        self._dec_const = host.decode * model.n_layers if eager and not graphed_decode else 0.0
        self._dec_kv = 0.0
        self._dec_seq = 0.0
        self._dec_vkv = 0.0
        self._dec_vkv_tiled: dict[int, float] = {}  # verify tile -> e summed (DecodeCoef)
        self._dec_ctx = 0.0
        self._dec_query = 0.0
        self._dec_packed: tuple[Any, ...] | None = None  # for the compiled decode_dense_max
        self._dec_step: tuple[Any, ...] | None = None  # for the compiled decode_step_packed
        for kind, n in counts.items():
            c = coef_of(coefs.decode, kind, "decode")
            self._dec.append((n, c.w, c.b, c.tile, np.asarray(c.steps, dtype=float)))
            self._dec_const += n * c.a
            self._dec_kv += n * c.c
            self._dec_seq += n * c.d
            if c.verify_tile == 1:
                self._dec_vkv += n * c.e
            else:
                tiled = self._dec_vkv_tiled.get(c.verify_tile, 0.0)
                self._dec_vkv_tiled[c.verify_tile] = tiled + n * c.e
            self._dec_ctx += n * c.h
            self._dec_query += n * c.q
        # across ranks, a rank's experts cost their own work where the profile timed it alone:
        # DeepEP's kernels sort, quantize, gather and combine the rows (their time is the
        # all-to-all's); in prefill an engine's fused permutes remain (each moves a row once; not
        # charged). One rank (the engine core's replays) runs the whole measured call.
        alone = (
            coefs.moe_experts if shape.expert_groups > 1 and not shape.replicated_tokens else None
        )
        # per phase, as plain floats for the hot path: (a, e, f, rows per tile, k)
        fits = {ph: alone or coefs.moe for ph in PHASES}
        self._moe_fit = {
            ph: (m.a, m.e, m.f, m.tile if m.form == "tile" else 1, m.k) for ph, m in fits.items()
        }
        self._moe_host = {
            ph: host.moe
            if eager
            and not (graphed_decode and ph == "decode")
            and not (overlap and ph == "prefill")
            else 0.0
            for ph in PHASES
        }
        self._moe_experts = model.experts_per_gpu(
            shape.expert_groups, shape.redundant_experts_per_gpu
        )
        self._top_k = model.moe.top_k
        if eager and not overlap:  # the engine core's own host time per step (EngineOverhead)
            sums, waves = self._pre
            sums = (
                sums[0] + eng.prefill_step_s + eng.prefill_loop_s,
                sums[1] + eng.prefill_per_token_s,
                *sums[2:],
            )
            self._pre = (sums, waves)
            self._pre_seq = eng.prefill_per_seq_s
        else:
            self._pre_seq = 0.0
        if eager:
            self._dec_const += eng.decode_step_s + eng.decode_loop_s
            self._dec_seq += eng.decode_per_seq_s + eng.decode_loop_per_seq_s
            self._dec_kv += eng.decode_per_kv_token_s
        self._moe_layers = {ph: model.moe_layer_count(ph) for ph in PHASES}
        a2a = coefs.a2a
        # the profile's measured exchange (NCCL between GPUs of one node) stands for the links
        # inside a node; scale-out links and the kernel modes come from the step parameters
        self._a2a = AllToAll(
            model, hw, shape.ep, step.all_to_all, a2a.link_efficiency, a2a.latency_s
        )
        self._set_tensor_parallel(model, hw, step)
        self._set_power_limit(hw, step)

    def prefill_step(
        self,
        ranks: Sequence[Sequence[Chunk]],
        imbalance: float = 1.0,
        replay: Sequence[Sequence[Chunk]] = (),
        slowdown: float = 1.0,
    ) -> float:
        graphed = self._graphed  # replay rows are rows of the prompts: not counted twice
        tokens = sum(n for c in ranks for n, _ in c)
        self.prefill_busy_share = 1.0
        if graphed is not None and tokens <= self._graph_tokens:
            t = graphed.prefill_step(ranks, imbalance, replay, slowdown) + self.prefill_loop_s
            seqs = sum(len(c) for c in ranks)
            return t + self._graph_step_s + self._graph_seq_s * seqs + self._graph_token_s * tokens
        t = super().prefill_step(ranks, imbalance, replay, slowdown)
        if self._pre_host is None:
            return t
        h0, h_seq, h_tok, exposed = self._pre_host
        seqs = sum(len(c) for c in ranks)
        host = h0 + h_seq * seqs + h_tok * tokens
        step = max(t, host) + exposed * min(t, host) + self.prefill_loop_s
        self.prefill_busy_share = t / step  # the GPU waits on the host for the rest
        return step

    def prefill_dense(self, chunks: Sequence[Chunk]) -> float:
        return _dense_sum(self._pre, chunks, self._pre_seq)

    def prefill_dense_without_attention(self, chunks: Sequence[Chunk]) -> float:
        A, B = self._pre[0][0], self._pre[0][1]
        return A + sum(n * B + self._pre_seq for n, _ in chunks)

    def replay_dense(self, chunks: Sequence[Chunk]) -> float:
        if self._rep is None:
            return 0.0
        return _dense_sum(self._rep, chunks, 0.0)

    def decode_dense(self, batch: np.ndarray, kv_tokens: np.ndarray, verify: float) -> np.ndarray:
        tokens = batch * verify
        t = self._dec_const + self._dec_kv * kv_tokens + self._dec_seq * batch
        if self._dec_query:
            t = t + self._dec_query * tokens
        if self._dec_vkv:
            t = t + self._dec_vkv * verify * kv_tokens
        for vt, e in self._dec_vkv_tiled.items():
            t = t + e * tiled_verify(verify, vt) * kv_tokens
        if self._dec_ctx:
            mean_ctx = np.divide(kv_tokens, batch, out=np.zeros_like(t), where=batch > 0)
            t = t + self._dec_ctx * mean_ctx
        for n, w, b, tile, steps in self._dec:
            t = t + n * np.maximum(w, gemm_cost(tokens, b, tile, steps))
        return t

    def decode_dense_max(self, batch: np.ndarray, kv: np.ndarray, tokens: np.ndarray) -> float:
        if not COMPILED:
            return super().decode_dense_max(batch, kv, tokens)
        return float(decode_dense_max_compiled(batch, kv, tokens, *self._decode_coefs()))

    def decode_step_packed(self, load: np.ndarray, imbalance: float = 1.0) -> float:
        if not COMPILED:
            return super().decode_step_packed(load, imbalance)
        if self._dec_step is None:
            self._dec_step = self._pack_decode_step()
        return float(decode_step_compiled(load, imbalance, *self._dec_step))

    def _pack_decode_step(self) -> tuple[Any, ...]:
        """What :func:`decode_step_compiled` takes besides the load: the shape, the dense
        layers' coefficients, the all-reduces, the routed experts' fit, the exchange and the
        step's composition, as plain numbers in the reference's terms."""
        shape = self.shape
        ph: Phase = "decode"
        tp = (self._tp_layers[ph], self._tp_alpha, self._tp_beta, shape.tp)
        moe = (
            *self._moe_fit[ph],
            self._top_k,
            self._moe_experts,
            self._moe_host[ph],
            self._moe_layers[ph],
        )
        compose = (shape.two_batch_overlap, self.step_overhead_s, self.comm_overlap)
        return (
            sum_block(),
            self._decode_coefs(),
            tp,
            (shape.replicated_tokens, shape.expert_groups),
            moe,
            self._a2a.packed(ph),
            compose,
        )

    def _decode_coefs(self) -> tuple[Any, ...]:
        """:meth:`_pack_decode`, packed once."""
        if self._dec_packed is None:
            self._dec_packed = self._pack_decode()
        return self._dec_packed

    def _pack_decode(self) -> tuple[Any, ...]:
        """:meth:`decode_dense`'s coefficients as :func:`decode_dense_max_compiled` takes
        them (the tiled verify terms and the GEMM kinds in the order the reference adds them)."""
        kinds = self._dec
        longest = max([len(steps) for *_, steps in kinds], default=0)
        table = np.zeros((len(kinds), max(1, longest)))
        for i, (*_, steps) in enumerate(kinds):
            table[i, : len(steps)] = steps
        return (
            self._dec_const,
            self._dec_kv,
            self._dec_seq,
            self._dec_query,
            self._dec_vkv,
            np.array(list(self._dec_vkv_tiled), dtype=np.int64),
            np.array(list(self._dec_vkv_tiled.values()), dtype=np.float64),
            self._dec_ctx,
            np.array([k[0] for k in kinds], dtype=np.int64),
            np.array([k[1] for k in kinds], dtype=np.float64),
            np.array([k[2] for k in kinds], dtype=np.float64),
            np.array([k[3] for k in kinds], dtype=np.int64),
            table,
            np.array([len(k[4]) for k in kinds], dtype=np.int64),
        )

    def moe_s(self, tokens_per_rank: float, phase: Phase) -> float:
        if tokens_per_rank <= 0:
            return 0.0
        if COMPILED:
            return float(
                moe_s_compiled(
                    tokens_per_rank,
                    *self._moe_fit[phase],
                    self._top_k,
                    self._moe_experts,
                    self._moe_host[phase],
                    self._moe_layers[phase],
                )
            )
        a, e, f, tile, k = self._moe_fit[phase]
        pairs = tokens_per_rank * self._top_k
        E = self._moe_experts
        active = E * (1.0 - fpmath.exp(-pairs / E))
        rows = pairs if tile == 1 else tile * active * math.ceil(pairs / (active * tile))
        if k == 1.0:  # the additive form, exactly as before k existed
            per_layer = a + self._moe_host[phase] + e * active + f * rows
            return per_layer * self._moe_layers[phase]
        # (w^k + g^k)^(1/k) as m·((w/m)^k + (g/m)^k)^(1/k), like calibration.fit.smooth_sum
        w, g = e * active, f * rows
        m = w if w > g else g
        both = (
            m * fpmath.power(fpmath.power(w / m, k) + fpmath.power(g / m, k), 1.0 / k)
            if m > 0
            else 0.0
        )
        return (a + self._moe_host[phase] + both) * self._moe_layers[phase]


def _dense_sum(sums: DenseSums, chunks: Sequence[Chunk], per_seq: float) -> float:
    """One DP rank's non-expert time of ``chunks`` (new tokens, computed prefix) from a side's
    summed fits (the module docstring's prefill_dense)."""
    (A, B, C, D, E, F, G), waves = sums
    t = A
    for n, p in chunks:
        t += n * (B + C * p + D * n) + E * p + per_seq
        if p:
            t += F + G * n
            for cw, tile, tiles in waves:
                t += cw * p * wave_rows(n, tile, tiles)
    return t


@njit
def decode_dense_max_compiled(
    batch: np.ndarray,
    kv: np.ndarray,
    tokens: np.ndarray,
    const: float,
    c_kv: float,
    c_seq: float,
    c_query: float,
    c_vkv: float,
    tiled_vt: np.ndarray,
    tiled_e: np.ndarray,
    c_ctx: float,
    kind_layers: np.ndarray,
    kind_w: np.ndarray,
    kind_b: np.ndarray,
    kind_tile: np.ndarray,
    kind_steps: np.ndarray,
    kind_nsteps: np.ndarray,
) -> float:
    """:meth:`ProfileStepCost.decode_dense_max` (``decode_dense`` over the ranks, then the
    largest), compiled: per rank, the same operations in the same order as the reference."""
    best = -math.inf
    for i in range(batch.size):
        b = batch[i]
        verify = tokens[i] / b if b > 0 else 1.0
        tok = b * verify
        t = const + c_kv * kv[i] + c_seq * b
        if c_query:
            t = t + c_query * tok
        if c_vkv:
            t = t + c_vkv * verify * kv[i]
        for m in range(tiled_vt.size):
            vt = tiled_vt[m]
            tv = verify if vt == 1 else np.ceil(verify / vt) * vt
            t = t + tiled_e[m] * tv * kv[i]
        if c_ctx:
            t = t + c_ctx * (kv[i] / b if b > 0 else 0.0)
        for g in range(kind_layers.size):
            tile = kind_tile[g]
            if tile == 1:
                cost = kind_b[g] * tok
            else:
                k = np.ceil(tok / tile)
                n = kind_nsteps[g]
                if n and k <= n:
                    cost = 0.0 if k < 1 else kind_steps[g, int(k) - 1]
                else:
                    cost = kind_b[g] * tile * k
            t = t + kind_layers[g] * max(kind_w[g], cost)
        if t > best:
            best = t
    return best


@njit
def moe_s_compiled(
    tokens_per_rank: float,
    a: float,
    e: float,
    f: float,
    tile: int,
    k: float,
    top_k: int,
    experts: float,
    host: float,
    layers: int,
) -> float:
    """:meth:`ProfileStepCost.moe_s` for tokens_per_rank > 0 (its fit, host time and layer
    count passed in), compiled: the same operations in the same order."""
    pairs = tokens_per_rank * top_k
    active = experts * (1.0 - exp(-pairs / experts))
    rows = pairs if tile == 1 else tile * active * math.ceil(pairs / (active * tile))
    if k == 1.0:
        return (a + host + e * active + f * rows) * layers
    w, g = e * active, f * rows
    m = w if w > g else g
    both = m * power(power(w / m, k) + power(g / m, k), 1.0 / k) if m > 0 else 0.0
    return (a + host + both) * layers


@njit
def decode_step_compiled(
    load: np.ndarray,
    imbalance: float,
    block: int,
    dec: tuple[Any, ...],
    tp: tuple[int, float, float, int],
    experts: tuple[bool, int],
    moe: tuple[Any, ...],
    a2a: tuple[int, float, float, int, float, float, float],
    compose: tuple[bool, float, float],
) -> float:
    """:meth:`StepCost.decode_step_packed` of a :class:`ProfileStepCost` (its parts packed by
    ``_pack_decode_step``), compiled: the slowest rank's dense time with the all-reduces, the
    routed experts at the hottest expert group's load and the exchange, composed as
    :meth:`StepCost.compose_step` does — the same operations in the same order (``block``: how
    numpy sums, :func:`~deepinfer_sim.jit.sum_block`)."""
    tbo, overhead, overlap = compose
    if tbo:  # each micro-batch: half of every row
        batch, kv, tokens = load[0] * 0.5, load[1] * 0.5, load[2] * 0.5
    else:
        batch, kv, tokens = load[0], load[1], load[2]
    dense = decode_dense_max_compiled(batch, kv, tokens, *dec)
    sent_max = tokens.max()
    tp_layers, tp_alpha, tp_beta, tp_width = tp
    if not (sent_max <= 0 or tp_width == 1):
        dense += tp_layers * (tp_alpha + tp_beta * sent_max)
    replicated, groups = experts
    received = (imbalance if groups > 1 else 1.0) * pairwise_sum(tokens, block) / groups
    a, e, f, tile, k, top_k, n_experts, host, moe_layers = moe
    routed = 0.0
    if received > 0:
        routed = moe_s_compiled(received, a, e, f, tile, k, top_k, n_experts, host, moe_layers)
    comm = 0.0
    ep, latency, per_token, a2a_layers, permute, share, dispatch_share = a2a
    if not replicated:
        if received > 0:
            routed = routed + received * permute * a2a_layers
        sent = max(sent_max / tp_width, received)
        if not (ep <= 1 or sent <= 0):
            comm = (latency + sent * per_token) * a2a_layers
    if tbo:
        d = dispatch_share * comm
        c = comm - d
        return (
            overhead
            + max(c, dense + share * c)
            + max(d, dense + share * d)
            + max(d, routed + share * d)
            + max(c, routed + share * c)
        )
    compute = dense + routed
    hidden = min(comm, overlap * compute)
    return overhead + compute + (comm - hidden) + share * hidden
