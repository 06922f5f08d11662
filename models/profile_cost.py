"""ProfileStepCost: the StepCost of a calibrated profile (measured or derived).

A profile holds per-layer fits for each attention kind plus the routed-expert and all-to-all
models (see ``calibration/profile.py``); this class composes them over the model's layer counts
once, at construction, into a handful of coefficients, so every call on the hot path is O(1):

    prefill_dense(chunks) = A + Σ_i (B·n_i + C·n_i·p_i + D·n_i²)        (sums over prefill layers)
    decode_dense(rank)    = Σ_kinds count·(a + max(w, b·T) + c·K + d·B)   (vectorized over ranks)
    moe_s(tokens)         = moe_layers · (a + max(e·E_local, f·tokens·top_k))

Decode fits are CUDA-graph replays where capture worked (production engines graph their decode
step); ``eager_decode=True`` adds the measured per-layer launch overhead back, for comparing
with an eager engine such as ``kernels/engine.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..calibration.profile import HardwareCoefs
from ..errors import ConfigError
from .cost import AllToAll, Chunk, Phase, PoolShape, StepCost, StepParams
from .hardware import HardwareSpec
from .spec import ModelSpec


class ProfileStepCost(StepCost):
    def __init__(
        self,
        model: ModelSpec,
        hw: HardwareSpec,
        shape: PoolShape,
        coefs: HardwareCoefs,
        step: StepParams | None = None,
        profile_name: str = "profile",
        eager_decode: bool = False,
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

        A = B = C = D = 0.0
        for g in model.layer_groups:
            if g.in_prefill:
                c = coef_of(coefs.prefill, g.attention, "prefill")
                A += g.count * c.a
                B += g.count * c.b
                C += g.count * c.c
                D += g.count * c.d
        self._pre = (A, B, C, D)
        # decode: group layer counts by kind, then per kind (count·a, w, b, count·c, count·d)
        counts: dict[str, int] = {}
        for g in model.layer_groups:
            counts[g.attention] = counts.get(g.attention, 0) + g.count
        self._dec = []
        # an eager engine (like kernels/engine.py) also pays the launch gaps that CUDA graphs hide
        host = coefs.decode_host_overhead_s if eager_decode else 0.0
        self._dec_const = host * model.n_layers
        self._dec_kv = 0.0
        self._dec_seq = 0.0
        for kind, n in counts.items():
            c = coef_of(coefs.decode, kind, "decode")
            self._dec.append((n * c.w, n * c.b))
            self._dec_const += n * c.a
            self._dec_kv += n * c.c
            self._dec_seq += n * c.d
        m = coefs.moe
        self._moe_const = m.a
        self._moe_mem = m.e * model.experts_per_gpu(shape.ep, shape.redundant_experts_per_gpu)
        self._moe_pair = m.f * model.moe.top_k
        self._moe_layers = {ph: model.moe_layer_count(ph) for ph in ("prefill", "decode")}
        a2a = coefs.a2a
        self._a2a = AllToAll(model, hw, shape.ep, a2a.latency_s, a2a.link_efficiency)

    def prefill_dense(self, chunks: Sequence[Chunk]) -> float:
        A, B, C, D = self._pre
        t = A
        for n, p in chunks:
            t += n * (B + C * p + D * n)
        return t

    def decode_dense(self, batch: np.ndarray, kv_tokens: np.ndarray, verify: float) -> np.ndarray:
        tokens = batch * verify
        t = self._dec_const + self._dec_kv * kv_tokens + self._dec_seq * batch
        for w, b in self._dec:
            t = t + np.maximum(w, b * tokens)
        return t

    def moe_s(self, tokens_per_rank: float, phase: Phase) -> float:
        if tokens_per_rank <= 0:
            return 0.0
        per_layer = self._moe_const + max(self._moe_mem, self._moe_pair * tokens_per_rank)
        return per_layer * self._moe_layers[phase]

    def a2a_s(self, tokens_per_rank: float, phase: Phase) -> float:
        return self._a2a.time(tokens_per_rank, phase)
