"""Per-token FLOPs and bytes: the cost of a token grows with the context it attends to.

The sparse-attention indexer of V4-family models scores every compressed KV entry, so a prefill
token at position 256K costs more than one at position 1K, though the top-k selection keeps the
attention itself bounded. These tests pin the magnitudes to hand-computed numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_sim.models.per_token import (
    decode_flops_per_token,
    decode_kv_bytes_per_token,
    prefill_flops_per_token,
)
from deepinfer_sim.models.registry import load_model


@pytest.fixture
def v41():
    return load_model("deepseek-v4.1-flash")


def test_prefill_flops_grow_with_context(v41):
    ctx = np.array([1_000.0, 16_000.0, 64_000.0, 256_000.0])
    f = prefill_flops_per_token(v41, ctx)
    assert np.all(np.diff(f) > 0)
    # ~2 FLOPs per active parameter (7.6B in the 20 encoder layers) at short context
    assert f[0] == pytest.approx(2 * v41.active_params("prefill"), rel=0.05)


def test_prefill_attention_increment_is_the_indexer_and_hca_slopes(v41):
    """Beyond the top-k knee (512 entries × 4 compression = 2,048 tokens) the per-token growth is
    linear: 5 CSA layers × 2·32·128/4 (indexer) + 15 HCA layers × 4·64·512/128 per token."""
    slope = 5 * 2 * 32 * 128 / 4 + 15 * 4 * 64 * 512 / 128
    a, b = prefill_flops_per_token(v41, np.array([100_000.0, 200_000.0]))
    assert (b - a) / 100_000 == pytest.approx(slope, rel=1e-9)


def test_decode_costs_more_than_prefill_per_token(v41):
    """A decode token passes all 40 layers (16B active), a prompt token only the 20 encoder ones."""
    assert decode_flops_per_token(v41, 10_000.0) > 1.8 * prefill_flops_per_token(v41, 10_000.0)


def test_decode_kv_bytes_grow_linearly_past_the_knees(v41):
    b = decode_kv_bytes_per_token(v41, np.array([10_000.0, 20_000.0, 30_000.0]))
    assert np.diff(b)[0] == pytest.approx(np.diff(b)[1])
    assert np.all(np.diff(b) > 0)
