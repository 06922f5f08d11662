"""FLOPs and bytes per token as functions of context length, for reports and sanity checks.

Prefill FLOPs per token grow with context because the CSA indexer scores every compressed entry
and HCA layers attend densely over the compressed cache; decode reads KV bytes that grow the same
way. The simulator's hot path uses the equivalent coefficients inside StepCost; these functions
expose the same numbers one token at a time.
"""

from __future__ import annotations

import numpy as np

from .attention import ArrayLike, AttentionCost
from .spec import ModelSpec


def prefill_flops_per_token(spec: ModelSpec, context: ArrayLike) -> ArrayLike:
    """FLOPs of one prompt token at position ``context`` (prefill layers only)."""
    dense, routed = spec.linear_flops_per_token("prefill")
    return dense + routed + AttentionCost.of(spec).prefill_flops.at(context)


def decode_flops_per_token(spec: ModelSpec, context: ArrayLike) -> ArrayLike:
    """FLOPs of one decoded token at context length ``context`` (every layer)."""
    dense, routed = spec.linear_flops_per_token("decode")
    return dense + routed + AttentionCost.of(spec).decode_flops.at(context)


def decode_kv_bytes_per_token(spec: ModelSpec, context: ArrayLike) -> ArrayLike:
    """KV-cache bytes one sequence's decode step reads at context length ``context``."""
    return AttentionCost.of(spec).decode_bytes.at(np.asarray(context, dtype=float))
