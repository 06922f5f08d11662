"""ModelSpec: what is served, and the quantities derived from it.

A ModelSpec is read from ``configs/models/*.yaml``. Everything the simulator needs to know about a
model — parameter counts, weight bytes per GPU at a given expert-parallel width, KV-cache bytes
per token, the SWA slot, FLOPs and bytes per token — is derived here from the architecture
numbers in that file, so the YAML stays the single source of truth. These are evaluated at load
time; the hot path only sees the plain numbers they produce.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Literal

from pydantic import Field, model_validator

from ..validation import FrozenModel

# Bytes per element of each storage format. The MX formats carry one 8-bit scale per 32 elements;
# NVFP4 one FP8 (E4M3) scale per 16 (plus a per-tensor FP32 scale, negligible).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "mxfp8": 1.0 + 1.0 / 32,
    "fp4": 0.5,
    "mxfp4": 0.5 + 1.0 / 32,
    "nvfp4": 0.5 + 1.0 / 16,
}
Dtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "mxfp8", "fp4", "mxfp4", "nvfp4"]
AttentionKind = Literal["swa", "csa", "hca", "mla"]


def dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES[dtype]


def compute_class(dtype: str) -> str:
    """The tensor-core rate class a stored dtype computes at (mxfp4 -> fp4, ...)."""
    classes = {"mxfp8": "fp8", "mxfp4": "fp4", "nvfp4": "fp4", "fp16": "bf16", "fp32": "bf16"}
    return classes.get(dtype, dtype)


class StatedParams(FrozenModel):
    total_b: float = Field(gt=0)
    active_prefill_b: float = Field(gt=0)
    active_decode_b: float = Field(gt=0)


class NgramMemory(FrozenModel):
    params_b: float = Field(0, ge=0)
    location: Literal["host", "hbm"] = "host"


class Attention(FrozenModel):
    heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    q_lora: int = Field(ge=0)
    o_lora: int = Field(ge=0)
    o_groups: int = Field(ge=1)
    window: int = Field(ge=0)
    indexer_heads: int = Field(ge=0)
    indexer_dim: int = Field(ge=0)
    index_topk: int = Field(ge=0)
    mla_value_head_dim: int = Field(0, ge=0)
    mla_qk_head_dim: int = Field(0, ge=0)
    mla_rope_dim: int = Field(
        0, ge=0, description="MLA: the decoupled rope part of a key, cached next to the latent"
    )


class LayerGroup(FrozenModel):
    name: str
    count: int = Field(gt=0)
    attention: AttentionKind
    compression: int = Field(1, ge=1)
    in_prefill: bool = True
    kv_stored: bool = True  # in the prefix cache and the P->D transfer
    kv_projected: bool = False  # rebuilt in decode HBM from stored state, never stored itself


class MoE(FrozenModel):
    routed_experts: int = Field(gt=0)
    top_k: int = Field(gt=0)
    shared_experts: int = Field(ge=0)
    expert_width: int = Field(gt=0)
    dense_layers: int = Field(0, ge=0)
    hash_routed_layers: int = Field(0, ge=0)
    dense_ffn_width: int = Field(0, ge=0)
    shared_expert_width: int | None = Field(
        None,
        gt=0,
        description="width of one shared expert (None: expert_width); differs from the routed "
        "experts' in a tensor-parallel slice (ModelSpec.tp_slice)",
    )
    expert_groups: int = Field(1, ge=1, description="routing groups (hierarchical EPLB)")
    topk_groups: int | None = Field(
        None,
        ge=1,
        description="node-limited routing: the groups one token may use (None: no limit)",
    )

    @model_validator(mode="after")
    def _topk_fits(self) -> MoE:
        if self.top_k > self.routed_experts:
            raise ValueError("top_k cannot exceed routed_experts")
        if self.routed_experts % self.expert_groups:
            raise ValueError("expert_groups must divide routed_experts")
        if self.topk_groups is not None and self.topk_groups > self.expert_groups:
            raise ValueError("topk_groups cannot exceed expert_groups")
        return self


class Precision(FrozenModel):
    experts: Dtype
    dense: Dtype
    kv_main: Dtype
    kv_indexer: Dtype
    activations_dispatch: Dtype
    activations_combine: Dtype


class SwaSlot(FrozenModel):
    layers: int = Field(ge=0)
    window: int = Field(ge=0)
    draft_tokens: int = Field(ge=0)
    bonus_tokens: int = Field(ge=0)
    bytes_per_token_layer: float = Field(ge=0)
    exact_replay_tokens: int = Field(ge=0)
    bounded_replay_tokens: int = Field(ge=0)


class Draft(FrozenModel):
    kind: Literal["dspark", "mtp", "none"]
    max_draft_tokens: int = Field(ge=0)
    layers: float = Field(
        0,
        ge=0,
        description="decoder layers of the draft model, each costed as one of the target's decode "
        "layers at the draft's rows (models/draft.py); 0: the drafter's time is not charged",
    )
    block: bool = Field(
        False,
        description="one pass drafts every position (a block drafter) instead of one pass per "
        "draft token (an MTP chain)",
    )


class ModelSpec(FrozenModel):
    """Architecture of one served model; see ``configs/models/``."""

    name: str
    display_name: str
    hidden: int = Field(gt=0)
    vocab: int = Field(gt=0)
    max_context_tokens: int = Field(gt=0)
    stated_params: StatedParams
    ngram_memory: NgramMemory = NgramMemory()
    attention: Attention
    layer_groups: tuple[LayerGroup, ...] = Field(min_length=1)
    moe: MoE
    precision: Precision
    swa: SwaSlot
    draft: Draft

    @model_validator(mode="after")
    def _layers_consistent(self) -> ModelSpec:
        if self.moe.dense_layers > self.n_layers:
            raise ValueError("moe.dense_layers exceeds the number of layers")
        if not any(g.in_prefill for g in self.layer_groups):
            raise ValueError("at least one layer group must run in prefill")
        return self

    # ---- layer counts -------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return sum(g.count for g in self.layer_groups)

    @property
    def prefill_layers(self) -> int:
        """Layers every prompt token runs through."""
        return sum(g.count for g in self.layer_groups if g.in_prefill)

    @property
    def replay_only_layers(self) -> int:
        """Layers that prefill runs only on the SWA replay segment (decoder layers)."""
        return sum(g.count for g in self.layer_groups if not g.in_prefill)

    def moe_layer_count(self, phase: Literal["prefill", "decode", "replay"]) -> int:
        """MoE layers a token passes in this phase (the leading dense layers are not MoE).
        ``replay``: the replay-only (decoder) layers an SWA replay token passes in prefill."""
        if phase == "replay":
            return self.moe_layer_count("decode") - self.moe_layer_count("prefill")
        layers = self.prefill_layers if phase == "prefill" else self.n_layers
        return max(0, layers - self.moe.dense_layers)

    # ---- parameters ---------------------------------------------------------------------------
    @property
    def expert_params(self) -> int:
        """One routed expert (gate, up, down projections)."""
        return 3 * self.hidden * self.moe.expert_width

    @property
    def expert_bytes(self) -> float:
        return self.expert_params * dtype_bytes(self.precision.experts)

    @property
    def shared_expert_params(self) -> int:
        """One shared expert (gate, up, down projections)."""
        return 3 * self.hidden * (self.moe.shared_expert_width or self.moe.expert_width)

    def tp_slice(self, tp: int, moe_tp: int = 1) -> ModelSpec:
        """What one GPU of a tensor-parallel group holds and computes, as a model of its own.

        Attention and dense layers split ``tp`` ways the way serving engines split them
        (Megatron-style): per-head projections (the query up-projection, MLA's key/value
        up-projection, the output projection; V4's grouped output projection by whole groups),
        the shared expert, dense FFNs and the vocabulary (embedding and output head) are sliced;
        the low-rank input projections, the latent (shared) KV head and its cache, the CSA
        indexer and the router are replicated — every GPU holds the whole KV cache of its
        sequences. Routed experts split ``moe_tp`` ways (expert tensor parallelism; 1: whole
        experts, spread by expert parallelism). An FFN width made of 128-column blocks is sliced
        into whole blocks, the slice padded up (what FP8 block-scaled kernels need; an engine
        pads or runs that GEMM wider). ``tp = moe_tp = 1`` is the model itself."""
        if tp == 1 and moe_tp == 1:
            return self
        a, moe = self.attention, self.moe

        def split(value: int, what: str, by: int) -> int:
            if value % by:
                raise ValueError(f"{self.name}: {what} ({value}) does not split {by} ways")
            return value // by

        def gemm_width(value: int, what: str, by: int) -> int:
            """A sliced GEMM width; a width made of 128-column blocks (FP8 block scaling) stays
            so, padded up (V4.1-Flash's 2,304-wide shared expert in 8 slices: 288 -> 384)."""
            sliced = split(value, what, by)
            return -(-sliced // 128) * 128 if value % 128 == 0 else sliced

        attention = {
            **a.model_dump(),
            "heads": split(a.heads, "attention heads", tp),
            "o_groups": split(a.o_groups, "output-projection groups", tp) if a.o_lora else 1,
        }
        shared = moe.shared_expert_width or moe.expert_width
        moe_slice = {
            **moe.model_dump(),
            "expert_width": gemm_width(moe.expert_width, "the routed expert width", moe_tp),
            "shared_expert_width": gemm_width(shared, "the shared expert width", tp)
            if tp > 1
            else shared,  # stated: the routed width no longer says it
            "dense_ffn_width": gemm_width(moe.dense_ffn_width, "the dense FFN width", tp),
        }
        suffix = f"@tp{tp}" + (f"-moetp{moe_tp}" if moe_tp > 1 else "")
        # validated anew (not model_copy, which would carry this model's cached properties)
        return type(self).model_validate(
            {
                **self.model_dump(),
                "name": self.name + suffix,
                "display_name": f"{self.display_name} (one GPU of TP{tp}"
                + (f", expert TP{moe_tp})" if moe_tp > 1 else ")"),
                "vocab": -(-self.vocab // tp),  # vocabulary-parallel: the last slice padded
                "attention": attention,
                "moe": moe_slice,
            }
        )

    def attention_params(self, group: LayerGroup) -> int:
        a, h = self.attention, self.hidden
        q_out = a.heads * (a.mla_qk_head_dim or a.head_dim)
        q = h * a.q_lora + a.q_lora * q_out if a.q_lora else h * q_out
        kv = h * a.head_dim
        if group.attention == "mla":
            # up-projections of the latent to per-head keys (nope part) and values
            rope = a.mla_rope_dim
            kv += (a.head_dim - rope) * a.heads * (a.mla_qk_head_dim - rope + a.mla_value_head_dim)
            v_width = a.heads * a.mla_value_head_dim
        else:
            v_width = a.heads * a.head_dim
        # grouped low-rank output projection (V4) or a plain one (V3)
        o = v_width * a.o_lora + a.o_groups * a.o_lora * h if a.o_lora else v_width * h
        idx = 0
        if group.attention == "csa" and a.indexer_heads:
            idx = h * a.indexer_heads * a.indexer_dim + h * a.indexer_dim + h * a.indexer_heads
        return q + kv + o + idx

    def _layers_in(self, phase: str) -> list[LayerGroup]:
        return [g for g in self.layer_groups if phase == "decode" or g.in_prefill]

    def _dense_params(self, phase: str | None) -> float:
        """Non-routed parameters (attention, shared experts, dense FFNs) of the phase's layers."""
        groups = self.layer_groups if phase is None else self._layers_in(phase)
        layers = sum(g.count for g in groups)
        attn = sum(self.attention_params(g) * g.count for g in groups)
        dense_ffn_layers = min(self.moe.dense_layers, layers)
        ffn = dense_ffn_layers * 3 * self.hidden * self.moe.dense_ffn_width
        moe_layers = layers - dense_ffn_layers
        shared = moe_layers * self.moe.shared_experts * self.shared_expert_params
        router = moe_layers * self.hidden * self.moe.routed_experts
        return float(attn + ffn + shared + router)

    @cached_property
    def embedding_params(self) -> int:
        return 2 * self.vocab * self.hidden  # input embedding + output head

    @cached_property
    def dense_params(self) -> float:
        """Every non-routed parameter, replicated on each DP rank."""
        return self._dense_params(None) + self.embedding_params

    @cached_property
    def routed_params(self) -> float:
        return float(self.moe.routed_experts * self.expert_params * self.moe_layer_count("decode"))

    @property
    def total_params(self) -> float:
        return self.dense_params + self.routed_params

    def active_params(self, phase: Literal["prefill", "decode"]) -> float:
        """Parameters one token touches (output head counted for decode only)."""
        routed = self.moe.top_k * self.expert_params * self.moe_layer_count(phase)
        head = self.vocab * self.hidden if phase == "decode" else 0
        return self._dense_params(phase) + routed + head

    # ---- memory -------------------------------------------------------------------------------
    @property
    def dense_weight_bytes(self) -> float:
        return self.dense_params * dtype_bytes(self.precision.dense)

    def experts_per_gpu(self, ep: int, redundant_per_gpu: float = 0) -> float:
        return self.moe.routed_experts / ep + redundant_per_gpu

    def weight_bytes_per_gpu(self, ep: int, redundant_per_gpu: float = 0) -> float:
        """HBM for weights on one EP rank: full dense copy + its owned and redundant experts."""
        layers = self.moe_layer_count("decode")
        experts = self.experts_per_gpu(ep, redundant_per_gpu) * layers * self.expert_bytes
        return self.dense_weight_bytes + experts

    def kv_bytes_per_token(self, accounting: Literal["stored", "bf16"] = "stored") -> float:
        """Block-cache bytes per context token kept in the prefix cache and sent P->D."""
        return self._kv_bytes(accounting, lambda g: g.kv_stored)

    def kv_hbm_bytes_per_token(self) -> float:
        """Block-cache bytes per context token a decode rank holds (stored + projected caches)."""
        return self._kv_bytes("stored", lambda g: g.kv_stored or g.kv_projected)

    def _kv_bytes(self, accounting: str, include: Callable[[LayerGroup], bool]) -> float:
        a = self.attention
        main = 2.0 if accounting == "bf16" else dtype_bytes(self.precision.kv_main)
        idx = 2.0 if accounting == "bf16" else dtype_bytes(self.precision.kv_indexer)
        total = 0.0
        for g in self.layer_groups:
            if not include(g):
                continue
            per = a.head_dim * main
            if g.attention == "csa":
                per += a.indexer_dim * idx
            total += g.count * per / g.compression
        return total

    @property
    def swa_slot_bytes(self) -> float:
        """One sequence's SWA slot: layers × (window + drafts + bonus) × bytes per token-layer."""
        s = self.swa
        return s.layers * (s.window + s.draft_tokens + s.bonus_tokens) * s.bytes_per_token_layer

    def kv_transfer_bytes(self, context_tokens: float) -> float:
        """Bytes moved from prefill to decode for one request (block cache + SWA slot)."""
        return self.kv_bytes_per_token() * context_tokens + self.swa_slot_bytes

    # ---- FLOPs and bytes per token --------------------------------------------------------------
    def linear_flops_per_token(
        self, phase: Literal["prefill", "decode", "replay"]
    ) -> tuple[float, float]:
        """(dense FLOPs, routed-expert FLOPs) of the matrix multiplies for one token."""
        if phase == "replay":  # decoder layers only, no output head
            routed = self.moe.top_k * self.expert_params * self.moe_layer_count("replay")
            dense = self._dense_params("decode") - self._dense_params("prefill")
            return 2.0 * dense, 2.0 * routed
        routed = self.moe.top_k * self.expert_params * self.moe_layer_count(phase)
        dense = self.active_params(phase) - routed
        return 2.0 * dense, 2.0 * routed
