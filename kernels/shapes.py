"""LayerShape: the widths of one V4.1-style layer, as the kernels see them.

A ``ModelSpec`` (``models/spec.py``) describes a whole model; the kernels need only the numbers of
one layer on one expert-parallel rank. ``LayerShape.from_model(spec, local_experts)`` reads them
from the spec (so they stay YAML values), and ``LayerShape.toy()`` gives tiny widths for CPU tests.

At the default model (``configs/models/deepseek-v4.1-flash.yaml``):

=====================  =========================================================
hidden                 5120
heads × head_dim       64 × 512, one shared K=V head of width 512 (MQA)
q_lora / o_lora        1280 / 1024, output projection in 8 groups of 8 heads
window                 128 (sliding window, causal, includes the token itself)
indexer                32 heads × 128, top-512 (CSA layers only)
compression            CSA 4, HCA 128 (KV vectors per compressed entry)
experts                384 routed (``local_experts`` of them on this rank), top-6,
                       1 shared, width 2304
=====================  =========================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from ..models.spec import ModelSpec

Kind = Literal["swa", "csa", "hca", "mla"]
KINDS: tuple[Kind, ...] = ("swa", "csa", "hca")  # the V4 kinds; "mla" is V3's latent attention


@dataclass(frozen=True, slots=True)
class LayerShape:
    hidden: int
    heads: int
    head_dim: int
    q_lora: int
    o_lora: int
    o_groups: int
    window: int
    indexer_heads: int
    indexer_dim: int
    index_topk: int
    csa_compression: int
    hca_compression: int
    local_experts: int
    top_k: int
    expert_width: int
    shared_experts: int
    shared_expert_width: int = 0  # 0: expert_width (a tensor-parallel slice narrows it apart)
    # MLA (V3) only: latent width, rotary width, per-head no-rope q/k width and value width
    kv_lora: int = 0
    rope_dim: int = 0
    qk_nope: int = 0
    v_head: int = 0

    def __post_init__(self) -> None:
        if self.heads % self.o_groups:
            raise ValueError("heads must divide into o_groups")
        if self.top_k > self.local_experts:
            raise ValueError("top_k cannot exceed local_experts")
        for name in ("hidden", "heads", "head_dim", "window", "expert_width", "local_experts"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    def compression(self, kind: Kind) -> int:
        """KV vectors per compressed entry (0 for window-only layers)."""
        return {"swa": 0, "csa": self.csa_compression, "hca": self.hca_compression, "mla": 0}[kind]

    @property
    def heads_per_group(self) -> int:
        return self.heads // self.o_groups

    @property
    def shared_width(self) -> int:
        return self.shared_experts * (self.shared_expert_width or self.expert_width)

    @classmethod
    def from_model(cls, spec: ModelSpec, local_experts: int) -> LayerShape:
        """The layer of ``spec`` with ``local_experts`` routed experts on this rank.

        The router of an EP rank here scores only its local experts, so ``top_k`` is capped at
        ``local_experts``. Compression factors come from the first CSA / HCA layer group
        (4 and 128 when the model has no such group).
        """
        a, moe = spec.attention, spec.moe
        comp = {g.attention: g.compression for g in reversed(spec.layer_groups)}
        mla: dict[str, int] = {}
        if a.mla_qk_head_dim:
            # V3: q/k = no-rope part (the value width) + rope; the cached latent is head_dim − rope
            rope = a.mla_qk_head_dim - a.mla_value_head_dim
            mla = {
                "kv_lora": a.head_dim - rope,
                "rope_dim": rope,
                "qk_nope": a.mla_value_head_dim,
                "v_head": a.mla_value_head_dim,
            }
        return cls(
            hidden=spec.hidden,
            heads=a.heads,
            head_dim=a.head_dim,
            q_lora=a.q_lora or spec.hidden,
            o_lora=a.o_lora or spec.hidden // a.o_groups,
            o_groups=a.o_groups,
            window=a.window or 128,
            indexer_heads=a.indexer_heads,
            indexer_dim=a.indexer_dim,
            index_topk=a.index_topk,
            csa_compression=comp.get("csa", 4),
            hca_compression=comp.get("hca", 128),
            local_experts=local_experts,
            top_k=min(moe.top_k, local_experts),
            expert_width=moe.expert_width,
            shared_experts=moe.shared_experts,
            shared_expert_width=moe.shared_expert_width or 0,
            **mla,
        )

    @property
    def is_mla(self) -> bool:
        return self.kv_lora > 0

    @classmethod
    def toy(cls, **over: Any) -> LayerShape:
        """Tiny widths for CPU tests: hidden 64, 4 heads × 32, window 8, compression 2 and 8."""
        base = cls(
            hidden=64,
            heads=4,
            head_dim=32,
            q_lora=48,
            o_lora=24,
            o_groups=2,
            window=8,
            indexer_heads=2,
            indexer_dim=16,
            index_topk=4,
            csa_compression=2,
            hca_compression=8,
            local_experts=8,
            top_k=2,
            expert_width=40,
            shared_experts=1,
        )
        return replace(base, **over)

    def scaled(self, **over: Any) -> LayerShape:
        """This shape with some fields replaced (e.g. fewer local experts)."""
        return replace(self, **over)
