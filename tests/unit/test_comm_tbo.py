"""All-to-all topology (node-limited routing, DeepEP's two modes), two-batch overlap, MLA's two
attention forms, NVFP4 and fractional redundant experts in the roofline cost model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.models.attention import AttentionCost, mla_prefix_flops
from deepinfer_sim.models.comm import AllToAll, AllToAllParams, routing_spread
from deepinfer_sim.models.cost import (
    PoolShape,
    RooflineParams,
    RooflineStepCost,
    StepParams,
    micro_batches,
)
from deepinfer_sim.models.registry import load_hardware, load_model
from deepinfer_sim.models.spec import compute_class, dtype_bytes
from deepinfer_sim.scenario import load_scenario
from deepinfer_sim.sim.core.assemble import make_step_cost

V3 = "deepseek-v3"


def roofline(
    name: str, hw: str, ep: int, tbo: bool = False, redundant: float = 0
) -> RooflineStepCost:
    return RooflineStepCost(
        load_model(name),
        load_hardware(hw),
        PoolShape(ep, redundant, tbo),
        RooflineParams(),
        StepParams(step_overhead_s=0.0),
    )


def test_node_limited_routing_bounds_the_nodes_a_v3_token_reaches() -> None:
    """V3 at EP32 on H800 (4 nodes of 8): 8 expert groups, 2 per node, each token confined to
    4 groups. A node is missed when none of the token's 4 groups is on it: C(6,4)/C(8,4) = 15/70,
    so a token reaches 4·(1 − 15/70) = 3.14 nodes, 2.36 of them remote — not 8 copies."""
    remote, local_gpus, remote_gpus = routing_spread(load_model(V3), 32, 8)
    miss = math.comb(6, 4) / math.comb(8, 4)
    assert remote == pytest.approx(3 * (1 - miss), rel=1e-9)
    assert 0 < local_gpus + remote_gpus <= 8  # distinct GPUs among top-8 experts


def test_without_group_limits_a_token_spreads_over_nodes_like_its_experts() -> None:
    """V4.1-Flash has no group limit: 6 experts drawn from 256 over 8 B200 nodes."""
    model = load_model("deepseek-v4.1-flash")
    remote, _, _ = routing_spread(model, 64, 8)
    E = model.moe.routed_experts
    miss = math.comb(E - E // 8, 6) / math.comb(E, 6)
    assert remote == pytest.approx(7 * (1 - miss), rel=1e-9)
    assert routing_spread(model, 64, 72)[0] == 0.0  # one NVL72 domain: nothing leaves it


def test_normal_mode_sends_a_token_once_per_remote_node() -> None:
    """Prefill (DeepEP normal kernels) at V3 EP32 on H800: the scale-out bytes per token are the
    remote nodes × hidden × (1 B FP8 dispatch + 2 B BF16 combine); decode's low-latency kernels
    send each of the 8 copies that lives off-node instead (7/8 of them at EP32... here 3/4)."""
    model, hw = load_model(V3), load_hardware("h800")
    a2a = AllToAll(model, hw, 32)
    remote, _, _ = routing_spread(model, 32, 8)
    payload = 7168 * 3
    assert a2a.bytes_per_token("prefill")[0] == pytest.approx(remote * payload)
    assert a2a.bytes_per_token("decode")[0] == pytest.approx(8 * 24 / 32 * payload)
    # a big prefill batch is bound by the NIC at the normal kernels' achieved bandwidth
    tokens = 16384
    t = a2a.time(tokens, "prefill") / model.moe_layer_count("prefill")
    assert t == pytest.approx(
        2 * hw.scaleout.latency_s + tokens * remote * payload / 50e9, rel=1e-6
    )


def test_low_latency_decode_matches_deepeps_published_ep128_exchange() -> None:
    """DeepEP's README (H800, EP128, 128 tokens, top-8, FP8 dispatch / BF16 combine): dispatch
    192 µs at 39 GB/s and combine 369 µs at 39 GB/s per layer. The low-latency mode's defaults
    reproduce their sum within 5 % (SGLang reads ≈ 0.17 ms per dispatch from DeepSeek's
    profile)."""
    model, hw = load_model(V3), load_hardware("h800")
    a2a = AllToAll(model, hw, 128)
    per_layer = a2a.time(128, "decode") / model.moe_layer_count("decode")
    assert per_layer == pytest.approx(192e-6 + 369e-6, rel=0.05)


def test_the_engine_permutes_around_the_normal_kernels_only() -> None:
    """Prefill (normal kernels) at V3 EP32 on H800: a rank receiving t tokens' worth of rows
    holds 8·t expert rows and t·(GPUs a token reaches) arrived tokens; the engine moves each
    through HBM once (dispatch payload into expert order, expert output back per token) at
    the copy bandwidth. Decode's low-latency kernels write the expert layout themselves, and
    one GPU alone has no exchange to permute around."""
    model, hw = load_model(V3), load_hardware("h800")
    a2a = AllToAll(model, hw, 32)
    _, local_gpus, remote_gpus = routing_spread(model, 32, 8)
    rows, arrived = 8 * 1000, (local_gpus + remote_gpus) * 1000
    per_layer = a2a.permute_s(1000, "prefill") / model.moe_layer_count("prefill")
    assert per_layer == pytest.approx((rows + arrived) * 7168 * 3 / (3.35e12 * 0.88), rel=1e-9)
    assert a2a.permute_s(1000, "decode") == 0.0
    assert AllToAll(model, hw, 1).permute_s(1000, "prefill") == 0.0
    # a step's experts carry it: the same load with the permutes at twice the bandwidth
    slow = roofline(V3, "h800", 32)
    fast_a2a = AllToAllParams(normal_permute_memory_efficiency=1.0)
    fast = RooflineStepCost(
        model, hw, PoolShape(32, 0), RooflineParams(), StepParams(all_to_all=fast_a2a)
    )
    slow_m, _ = slow.experts_and_exchange(1000, 32_000, 1.0, "prefill")
    fast_m, _ = fast.experts_and_exchange(1000, 32_000, 1.0, "prefill")
    assert slow_m - fast_m == pytest.approx(a2a.permute_s(1000, "prefill") * (1 - 0.88))


def test_a_measured_scale_up_exchange_replaces_the_defaults_inside_a_node() -> None:
    model, hw = load_model(V3), load_hardware("h800")
    slow = AllToAll(model, hw, 8, AllToAllParams(), scaleup_efficiency=0.25, latency_s=0.0)
    fast = AllToAll(model, hw, 8, AllToAllParams(), scaleup_efficiency=1.0, latency_s=0.0)
    assert slow.time(4096, "prefill") == pytest.approx(4 * fast.time(4096, "prefill"))


def test_micro_batches_split_whole_chunks_at_half_the_tokens_as_sglang() -> None:
    """SGLang's split of a prefill batch: whole sequences, the first micro-batch up to the one at
    which the running count reaches half the tokens, never the last; one chunk is halved."""
    assert micro_batches([(100, 0), (7, 50), (1, 9)]) == ([(100, 0)], [(7, 50), (1, 9)])
    assert micro_batches([(4096, 0)] * 4) == ([(4096, 0)] * 2, [(4096, 0)] * 2)
    assert micro_batches([(10, 0), (10, 5), (100, 0)]) == ([(10, 0), (10, 5)], [(100, 0)])
    assert micro_batches([(3, 0), (9, 0)]) == ([(3, 0)], [(9, 0)])
    assert micro_batches([(101, 7)]) == ([(50, 7)], [(51, 57)])
    assert micro_batches([(1, 7)]) == ([], [(1, 7)])


def test_two_batch_overlap_hides_communication_stage_by_stage_and_pays_fixed_costs_twice() -> None:
    """TBO: two micro-batches of half the load, B one stage behind A, each stage of one under a
    stage of the other: step = max(a, e) + max(d, a) + max(m, d) + max(e, m) (attention,
    dispatch, experts, combine of one micro-batch). V3 on 18 H800 nodes (EP144): at batch 128
    it hides most of the all-to-all but not all (the combine outlasts the experts it runs
    under), so it is longer than the two streams' perfect overlap; at batch 1 the weight reads
    are paid twice and TBO loses."""
    plain, tbo = roofline(V3, "h800", 144), roofline(V3, "h800", 144, tbo=True)
    assert tbo.dispatch_share == pytest.approx(1 / 3)  # FP8 out, BF16 back
    big = np.full(144, 128.0), np.full(144, 128.0 * 4096)
    b_tbo = tbo.decode_breakdown(*big, 1.0)
    assert b_tbo.step_s == pytest.approx(tbo.decode_step(*big, 1.0))
    half = plain.decode_breakdown(np.full(144, 64.0), np.full(144, 64.0 * 4096), 1.0)
    a, m, comm = half.dense_s, half.experts_s, half.a2a_s
    d, e = comm / 3, 2 * comm / 3
    assert b_tbo.step_s == pytest.approx(max(a, e) + max(d, a) + max(m, d) + max(e, m))
    assert 2 * max(a + m, comm) < b_tbo.step_s < 2 * (a + m + comm)
    assert 0 < b_tbo.a2a_exposed_s < 0.5 * b_tbo.a2a_s
    one = np.ones(144), np.full(144, 4096.0)
    assert tbo.decode_step(*one, 1.0) > plain.decode_step(*one, 1.0)


def test_two_batch_overlap_without_communication_or_compute_is_the_two_halves_back_to_back() -> (
    None
):
    tbo = roofline(V3, "h800", 144, tbo=True)
    for phase in ("decode", "prefill"):
        assert tbo.compose_tbo(3.0, 1.0, 0.0, phase) == pytest.approx(tbo.step_overhead_s + 8.0)
        assert tbo.compose_tbo(0.0, 0.0, 3.0, phase) == pytest.approx(tbo.step_overhead_s + 6.0)


def test_two_batch_overlap_in_prefill_pays_the_exchanges_sm_share() -> None:
    """A stage of compute c under a normal-mode exchange x lasts max(x, c + s·x): the exchange's
    kernels hold a share s of the SMs. Compute-bound (c > (1 - s)·x) the stage grows by s·x;
    exchange-bound the compute finishes inside it. Decode's low-latency kernels hold none."""
    s = 20 / 132
    tbo = RooflineStepCost(
        load_model(V3),
        load_hardware("h800"),
        PoolShape(32, 0, True),
        RooflineParams(),
        StepParams(step_overhead_s=1e-4, all_to_all=AllToAllParams(normal_sm_share=s)),
    )
    o = 1e-4
    a, m, comm = 3.0, 1.0, 0.9  # d = 0.3, e = 0.6: every stage compute-bound
    expected = o + (a + s * 0.6) + (a + s * 0.3) + (m + s * 0.3) + (m + s * 0.6)
    assert tbo.compose_tbo(a, m, comm, "prefill") == pytest.approx(expected)
    assert tbo.compose_tbo(a, m, comm, "decode") == pytest.approx(o + 2 * (a + m))
    # experts (1.0) under a combine of 3.0: the stage is the combine's
    assert tbo.compose_tbo(3.0, 1.0, 4.5, "prefill") == pytest.approx(
        o + max(3.0, 3.0 + s * 3.0) + max(1.5, 3.0 + s * 1.5) + max(1.5, 1.0 + s * 1.5) + 3.0
    )


def test_reserved_gemm_sms_run_the_gemms_on_the_sms_the_exchange_leaves_all_step() -> None:
    """SGLang's overlapped prefill runs DeepGEMM on the SMs DeepEP's leave for the whole step:
    a stage of compute c = g + o (GEMMs g, other work o) under exchange x lasts
    max(x, g / (1 - s) + o + s·min(x, o)); without a GEMM split, or in decode (whose
    low-latency kernels hold no SMs), the shared rule holds; the step with a prefill batch pays
    it as its parts say (the breakdown's context-free dense time and the experts less permutes)."""
    s = 20 / 132
    params = StepParams(step_overhead_s=1e-4, all_to_all=AllToAllParams(normal_sm_share=s))
    model, hw = load_model(V3), load_hardware("h800")
    shared = RooflineStepCost(model, hw, PoolShape(32, 0, True), RooflineParams(), params)
    reserved = RooflineStepCost(
        model, hw, PoolShape(32, 0, True, reserved_gemm_sms=True), RooflineParams(), params
    )
    o = 1e-4
    a, m, comm, ga, gm = 3.0, 1.0, 0.9, 2.0, 0.8  # d = 0.3, e = 0.6
    oa, om = a - ga, m - gm
    g = 1 / (1 - s)
    expected = o + sum(
        gemm * g + other + s * min(x, other)
        for gemm, other, x in ((ga, oa, 0.6), (ga, oa, 0.3), (gm, om, 0.3), (gm, om, 0.6))
    )
    assert reserved.compose_tbo(a, m, comm, "prefill", (ga, gm)) == pytest.approx(expected)
    assert expected > shared.compose_tbo(a, m, comm, "prefill", (ga, gm))
    for cost in (shared, reserved):
        assert cost.compose_tbo(a, m, comm, "decode", (ga, gm)) == pytest.approx(o + 2 * (a + m))
    assert reserved.compose_tbo(a, m, comm, "prefill") == shared.compose_tbo(a, m, comm, "prefill")
    # exchanges longer than the stretched compute set every stage: both micro-batches' exchanges
    assert reserved.compose_tbo(0.1, 0.1, 30.0, "prefill", (0.1, 0.1)) == pytest.approx(o + 60.0)
    ranks = [[(4096, 0)] * 4] * 32
    bd = reserved.prefill_breakdown(ranks)
    assert bd.step_s == pytest.approx(reserved.prefill_step(ranks))
    assert reserved.prefill_step(ranks) > shared.prefill_step(ranks)


def test_two_batch_overlap_in_prefill_and_the_packed_decode_path() -> None:
    tbo = roofline(V3, "h800", 32, tbo=True)
    ranks = [[(4096, 0), (4096, 0), (4096, 0), (4096, 0)]] * 32
    assert tbo.prefill_breakdown(ranks).step_s == pytest.approx(tbo.prefill_step(ranks))
    load = np.stack([np.full(32, 100.0), np.full(32, 4e5), np.full(32, 200.0), np.full(32, 8e5)])
    assert tbo.decode_step_packed(load) == pytest.approx(
        tbo.decode_step(np.full(32, 100.0), np.full(32, 4e5), 2.0), rel=1e-9
    )


def test_mla_prefill_is_costed_in_its_mha_form() -> None:
    """V3 prefill attention per context token: 2 · 128 heads · (192 + 128) FLOPs (MHA form), not
    the absorbed 2 · 128 · (576 + 512) that decode uses: ×3.4 less; a chunk after a prefix also
    up-projects the prefix's latents: 2 · 512 · 128 · (128 + 128) FLOPs per token and layer."""
    model = load_model(V3)
    att = AttentionCost.of(model)
    L = 10_000.0
    assert att.prefill_flops.at(L) == pytest.approx(61 * 2 * 128 * (192 + 128) * L)
    assert att.decode_flops.at(L) == pytest.approx(61 * 2 * 128 * (576 + 512) * L)
    assert mla_prefix_flops(model) == pytest.approx(2 * 512 * 128 * (128 + 128))
    assert att.prefix_flops == pytest.approx(61 * mla_prefix_flops(model))
    c = roofline(V3, "h800", 32)
    assert c.prefill_dense([(4096, 8192)]) > c.prefill_dense([(4096, 0)])


def test_attention_dtype_per_phase() -> None:
    model, hw = load_model(V3), load_hardware("h800")
    fp8 = RooflineStepCost(model, hw, PoolShape(8, 0), RooflineParams(), StepParams())
    bf16_prefill = RooflineStepCost(
        model, hw, PoolShape(8, 0), RooflineParams(prefill_attention_dtype="bf16"), StepParams()
    )
    long = [(16384, 100_000)]
    assert bf16_prefill.prefill_dense(long) > fp8.prefill_dense(long)
    B, K = np.array([64.0]), np.array([64.0 * 8192])
    np.testing.assert_allclose(bf16_prefill.decode_dense(B, K, 2.0), fp8.decode_dense(B, K, 2.0))


def test_nvfp4_and_fractional_redundant_experts() -> None:
    assert dtype_bytes("nvfp4") == pytest.approx(0.5625) and compute_class("nvfp4") == "fp4"
    model = load_model(V3)
    # DeepSeek's decode: 32 redundant experts over 144 GPUs
    assert model.experts_per_gpu(144, 32 / 144) == pytest.approx((256 + 32) / 144)
    assert model.weight_bytes_per_gpu(144, 32 / 144) > model.weight_bytes_per_gpu(144, 0)


def test_a_prefill_pool_reserves_gemm_sms_only_with_two_batch_overlap() -> None:
    """``pools.prefill.gemm_sms: reserved`` reaches the prefill pool's cost model; without
    two-batch overlap it is refused with a message naming the key."""
    sc = load_scenario(
        "default",
        ["pools.prefill.two_batch_overlap=true", "pools.prefill.gemm_sms=reserved"],
    )
    model, pool = load_model(sc.model), sc.pools.prefill
    hw = load_hardware(pool.hardware)
    cost = make_step_cost(sc, "prefill", model, hw, pool.ep, pool.redundant_per_gpu)
    assert cost.shape.reserved_gemm_sms and cost.shape.two_batch_overlap
    with pytest.raises(ConfigError, match="gemm_sms"):
        load_scenario("default", ["pools.prefill.gemm_sms=reserved"])
