"""Tensor parallelism of attention, dense layers and experts (issue 30, item 1).

A pool of ``ep`` GPUs runs its attention and dense layers ``tp``-way tensor parallel (``dp = ep /
tp`` data-parallel ranks) and its routed experts ``moe_tp``-way over ``ep / moe_tp`` expert
groups. One GPU's share is a model of its own (``ModelSpec.tp_slice``): fewer heads, narrower
shared experts and FFNs, a slice of the vocabulary — the latent KV head and its cache replicated.
The cost models price that slice and add the group's all-reduces; a pool whose one data-parallel
rank spans every GPU needs no all-to-all (each GPU holds every token).
"""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.models.cost import PoolShape, RooflineParams, RooflineStepCost, StepParams
from deepinfer_sim.models.registry import load_hardware, load_model

V3 = load_model("deepseek-v3")
V41 = load_model("deepseek-v4.1-flash")
H200 = load_hardware("h200")


def roofline(model, shape: PoolShape, **step) -> RooflineStepCost:
    spec = model.tp_slice(shape.tp, shape.moe_tp)
    return RooflineStepCost(spec, H200, shape, RooflineParams(), StepParams(**step))


def test_a_gpus_slice_divides_heads_and_ffns_and_keeps_the_latent_cache() -> None:
    s = V3.tp_slice(8)
    assert s.attention.heads == 16 and s.attention.head_dim == V3.attention.head_dim
    assert s.kv_bytes_per_token() == V3.kv_bytes_per_token()  # every GPU holds the whole cache
    assert s.moe.shared_expert_width == 256 and s.moe.dense_ffn_width == 2304
    assert s.moe.expert_width == V3.moe.expert_width  # routed experts whole: spread by EP
    assert s.vocab == V3.vocab // 8
    # the replicated low-rank projections keep a slice's dense weights above 1/8 of the model's
    assert V3.dense_params / 8 < s.dense_params < V3.dense_params / 4
    assert V3.tp_slice(1) is V3
    assert V3.tp_slice(2, 4).moe.expert_width == 512


def test_grouped_output_projections_split_by_whole_groups_and_narrow_ffns_pad() -> None:
    s = V41.tp_slice(4)
    assert (s.attention.heads, s.attention.o_groups) == (16, 2)
    assert s.moe.shared_expert_width == 640  # 2304 / 4 = 576, padded to five 128-column blocks
    with pytest.raises(ValueError, match="groups"):
        V41.tp_slice(16)  # 8 output groups do not split 16 ways


def test_a_slice_is_loadable_by_name() -> None:
    assert load_model("deepseek-v3@tp4").attention.heads == 32
    assert load_model("deepseek-v3@tp2-moetp2").moe.expert_width == 1024
    with pytest.raises(ConfigError, match="does not split"):
        load_model("deepseek-v4.1-flash@tp16")


def test_pool_shape_names_its_ranks_and_expert_groups() -> None:
    shape = PoolShape(ep=16, redundant_experts_per_gpu=0, tp=8, moe_tp=2)
    assert (shape.dp, shape.expert_groups, shape.replicated_tokens) == (2, 8, False)
    assert PoolShape(ep=8, redundant_experts_per_gpu=0, tp=8).replicated_tokens
    assert not PoolShape(ep=1, redundant_experts_per_gpu=0).replicated_tokens
    with pytest.raises(ValueError, match="divide"):
        PoolShape(ep=8, redundant_experts_per_gpu=0, tp=3)


def test_all_reduces_cost_latency_plus_a_ring_over_the_scale_up_link() -> None:
    """Per layer: allreduces_per_layer × (α + 2(tp−1)/tp · tokens · hidden · 2 B / link)."""
    cost = roofline(V3, PoolShape(ep=8, redundant_experts_per_gpu=0, tp=8))
    p = StepParams().tensor_parallel
    link = H200.scaleup.bytes_per_s_per_dir * p.bandwidth_efficiency
    per_token = p.allreduces_per_layer * 2 * 7 / 8 * V3.hidden * p.activation_bytes / link
    want = V3.n_layers * (p.allreduces_per_layer * p.allreduce_latency_s + 64 * per_token)
    assert cost.tp_comm_s(64, "decode") == pytest.approx(want)
    assert cost.tp_comm_s(0, "decode") == 0.0
    flat = roofline(V3, PoolShape(ep=8, redundant_experts_per_gpu=0))
    assert flat.tp_comm_s(64, "decode") == 0.0


def test_one_rank_over_all_gpus_needs_no_all_to_all_and_shows_its_all_reduces() -> None:
    tp8 = roofline(V3, PoolShape(ep=8, redundant_experts_per_gpu=0, tp=8))
    moe, comm = tp8.experts_and_exchange(32.0, 32.0, 1.0, "decode")
    assert comm == 0.0 and moe > 0
    parts = tp8.decode_breakdown(np.array([32.0]), np.array([32 * 4096.0]), 1.0)
    assert parts.tp_comm_s == pytest.approx(tp8.tp_comm_s(32, "decode"))
    assert parts.a2a_s == 0.0
    assert parts.as_dict()["tp_allreduce"] == pytest.approx(parts.tp_comm_s)
    assert parts.step_s == pytest.approx(
        tp8.decode_step(np.array([32.0]), np.array([32 * 4096.0]), 1.0)
    )


def test_one_expert_group_has_no_expert_imbalance() -> None:
    """The expert imbalance is the slowest expert group's load over the mean: where every GPU
    holds a slice of every expert (experts tensor parallel over the pool, one group) all do the
    same work, so a stated constant imbalance does not stretch their step; over two groups it
    does."""
    batch, kv = np.array([48.0]), np.array([48 * 4096.0])
    one = roofline(V3, PoolShape(ep=8, redundant_experts_per_gpu=0, tp=8, moe_tp=8))
    assert one.shape.expert_groups == 1
    assert one.decode_step(batch, kv, 1.0, 1.09) == one.decode_step(batch, kv, 1.0, 1.0)
    assert one.prefill_step([[(4096, 0)]], 1.074) == one.prefill_step([[(4096, 0)]], 1.0)
    two = roofline(V3, PoolShape(ep=8, redundant_experts_per_gpu=0, tp=8, moe_tp=4))
    assert two.decode_step(batch, kv, 1.0, 1.09) > two.decode_step(batch, kv, 1.0, 1.0)


def test_tensor_parallelism_buys_per_user_speed_at_small_batches() -> None:
    """At one sequence, eight GPUs of one rank read an eighth of the dense weights each: a
    step shorter than on one GPU of a DP-attention pool, which reads them all (both pay the
    roofline's fixed cost per layer, which the corpus fit sets at 175 µs)."""
    one = np.array([1.0])
    ctx = np.array([4096.0])
    dp8 = roofline(V3, PoolShape(ep=8, redundant_experts_per_gpu=0))
    tp8 = roofline(V3, PoolShape(ep=8, redundant_experts_per_gpu=0, tp=8))
    t_dp = dp8.decode_step(np.array([1.0, 0, 0, 0, 0, 0, 0, 0]), np.array([4096.0] + [0] * 7), 1.0)
    t_tp = tp8.decode_step(one, ctx, 1.0)
    assert t_tp < 0.9 * t_dp


def test_the_prefill_quadratic_is_fitted_over_data_parallel_ranks() -> None:
    tp8 = roofline(V3, PoolShape(ep=8, redundant_experts_per_gpu=0, tp=8))
    a, b, _, d = tp8.prefill_quadratic()
    t = tp8.prefill_step([[(4096, 0)]])
    assert a + b * 4096 + d * 4096**2 == pytest.approx(t, rel=0.15)
