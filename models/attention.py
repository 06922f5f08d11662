"""Attention FLOPs and KV bytes as closed-form functions of context length.

Each layer group's attention cost for one query at context length L is a sum of terms of the form
``min(slope · L, cap)`` (the window, the top-k sparse selection) and ``slope · L`` (the indexer
scoring every compressed entry, dense attention over a heavily compressed or MLA cache). Summing a
query's cost over a prefill chunk of n new tokens after a computed prefix p therefore has a closed
form (continuous approximation of the sum), which keeps the cost model O(1) per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import LayerGroup, ModelSpec, dtype_bytes

ArrayLike = float | np.ndarray


def mla_qk_width(spec: ModelSpec) -> int:
    return spec.attention.mla_qk_head_dim or spec.attention.head_dim


def mla_v_width(spec: ModelSpec) -> int:
    return (
        spec.attention.mla_value_head_dim or spec.attention.head_dim - spec.attention.mla_rope_dim
    )


def mla_prefix_flops(spec: ModelSpec) -> float:
    """FLOPs per cached prefix token and MLA layer of the MHA-form prefill: the prefix's latents
    are up-projected to per-head keys (no-rope part) and values before attention."""
    a = spec.attention
    latent = a.head_dim - a.mla_rope_dim
    return 2.0 * latent * a.heads * (mla_qk_width(spec) - a.mla_rope_dim + mla_v_width(spec))


@dataclass(frozen=True, slots=True)
class Term:
    """``weight · min(slope · L, cap)`` for one query at context length L (cap = inf: linear)."""

    weight: float
    slope: float
    cap: float


def _flop_terms(spec: ModelSpec, g: LayerGroup, absorbed: bool = True) -> list[Term]:
    """``absorbed``: MLA in its decode form (latent-width QK and PV); else the MHA form engines
    run for prefill (per-head QK at the q/k head width, PV at the value width)."""
    a = spec.attention
    hd = 4.0 * a.heads * a.head_dim  # QK^T and PV, 2 FLOPs per multiply-add each
    terms: list[Term] = []
    if g.attention == "mla":
        if absorbed:  # QK over latent + rope, PV over the latent
            width = float(a.head_dim + (a.head_dim - a.mla_rope_dim))
        else:
            width = float(mla_qk_width(spec) + mla_v_width(spec))
        return [Term(g.count * 2.0 * a.heads * width, 1.0, np.inf)]
    if a.window:
        terms.append(Term(g.count * hd, 1.0, float(a.window)))
    c = float(g.compression)
    if g.attention == "csa":
        terms.append(Term(g.count * 2.0 * a.indexer_heads * a.indexer_dim, 1.0 / c, np.inf))
        terms.append(Term(g.count * hd, 1.0 / c, float(a.index_topk)))
    elif g.attention == "hca":
        terms.append(Term(g.count * hd, 1.0 / c, np.inf))
    return terms


def _byte_terms(spec: ModelSpec, g: LayerGroup) -> list[Term]:
    """KV bytes one decode query reads at context L (shared by the verify tokens of a sequence)."""
    a = spec.attention
    main = dtype_bytes(spec.precision.kv_main)
    row = a.head_dim * main
    if g.attention == "mla":
        return [Term(g.count * row, 1.0, np.inf)]
    terms: list[Term] = []
    if a.window:
        terms.append(Term(g.count * row, 1.0, float(a.window)))
    c = float(g.compression)
    if g.attention == "csa":
        idx = a.indexer_dim * dtype_bytes(spec.precision.kv_indexer)
        terms.append(Term(g.count * idx, 1.0 / c, np.inf))
        terms.append(Term(g.count * row, 1.0 / c, float(a.index_topk)))
    elif g.attention == "hca":
        terms.append(Term(g.count * row, 1.0 / c, np.inf))
    return terms


class TermSum:
    """Σ_terms weight · min(slope · L, cap): vectorized (``at``) and scalar (``chunk``) forms.

    Terms with the same slope and cap are merged at construction, so a model has only a few.
    """

    __slots__ = ("_scalar", "cap", "knee", "lin_w", "slope", "weight")

    def __init__(self, terms: list[Term]) -> None:
        merged: dict[tuple[float, float], float] = {}
        lin_w = 0.0
        for t in terms:
            if np.isfinite(t.cap):
                merged[(t.slope, t.cap)] = merged.get((t.slope, t.cap), 0.0) + t.weight
            else:
                lin_w += t.weight * t.slope
        keys = sorted(merged)
        self.weight = np.array([merged[k] for k in keys])[:, None]
        self.slope = np.array([k[0] for k in keys])[:, None]
        self.cap = np.array([k[1] for k in keys])[:, None]
        self.knee = self.cap / self.slope
        self.lin_w = lin_w
        self._scalar = tuple((merged[k], k[0], k[1], k[1] / k[0]) for k in keys)

    def at(self, L: ArrayLike) -> ArrayLike:
        """Per-query value at context length L (vectorized)."""
        x = np.asarray(L, dtype=float)
        flat = x.reshape(-1)
        capped = (self.weight * np.minimum(self.slope * flat[None], self.cap)).sum(axis=0)
        out = (capped + self.lin_w * flat).reshape(x.shape)
        return float(out) if x.ndim == 0 else out

    def _integral(self, x: float) -> float:
        total = self.lin_w * x * x / 2
        for w, slope, cap, knee in self._scalar:
            if x <= knee:
                total += w * slope * x * x / 2
            else:
                total += w * (cap * knee / 2 + cap * (x - knee))
        return total

    def chunk(self, n: float, p: float) -> float:
        """Sum over the n queries at positions p+1 .. p+n (continuous approximation)."""
        # Hot path (once per sequence per prefill step): plain floats beat numpy on ~4 terms.
        return self._integral(p + n) - self._integral(p)

    def linear(self) -> tuple[float, float]:
        """(per-sequence constant, per-context-token slope) valid once every cap is reached."""
        return float((self.weight * self.cap).sum()), self.lin_w


@dataclass(frozen=True, slots=True)
class AttentionCost:
    """Attention FLOPs/bytes of one model, split by where the layers run."""

    prefill_flops: TermSum  # layers every prompt token passes (per chunk: .chunk(n, p))
    prefix_flops: float  # per chunk per prefix token (MLA prefill's up-projection of the prefix)
    replay_flops: TermSum  # layers prefill runs only on the SWA replay segment (decoder layers)
    decode_flops: TermSum  # every layer, per decoded token at context L (.at(L))
    decode_bytes: TermSum  # KV bytes one sequence's decode step reads at context L (.at(L))

    @classmethod
    def of(cls, spec: ModelSpec) -> AttentionCost:
        pre: list[Term] = []
        rep: list[Term] = []
        dec: list[Term] = []
        byt: list[Term] = []
        prefix = 0.0
        for g in spec.layer_groups:
            mha = _flop_terms(spec, g, absorbed=False)
            (pre if g.in_prefill else rep).extend(mha)
            dec.extend(_flop_terms(spec, g))
            byt.extend(_byte_terms(spec, g))
            if g.attention == "mla" and g.in_prefill:
                prefix += g.count * mla_prefix_flops(spec)
        return cls(TermSum(pre), prefix, TermSum(rep), TermSum(dec), TermSum(byt))
