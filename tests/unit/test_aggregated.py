"""Aggregated serving: one pool whose ranks prefill and decode in the same steps.

An aggregated instance (``serving: aggregated``, ``pools.aggregated``) is a decode group whose
ranks also run prompts: every step each running sequence's decode token goes in first, prefill
chunks fill the rest of the rank's token budget oldest first, and one ``StepCost.mixed_step``
call prices the batch. These tests read as its specification: requests are conserved; a decode
step that carries chunks is longer (the prefill stall shows in TPOT and ITL); no rank ever runs
more tokens than its budget; a lone prompt's TTFT is exactly its chunk steps; a prefix hit
shortens the prompt; a run is deterministic; the mixed step is its parts and reduces to the
decode or prefill step when one side is empty; a bad config is one error naming its key.

The deployment is V3 on one 8-GPU H200 node with TP8 attention and EP8 experts (one DP rank),
the most common published single-node setup, on the roofline cost model.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from conftest import make_source

from deepinfer_sim import simulate
from deepinfer_sim.errors import ConfigError
from deepinfer_sim.models.cost import PoolShape, RooflineParams, RooflineStepCost
from deepinfer_sim.models.registry import load_hardware, load_model
from deepinfer_sim.scenario import scenario_from_dict
from deepinfer_sim.sim.core.cluster import Cluster
from deepinfer_sim.sim.stages.aggregated import AggregatedInstance
from deepinfer_sim.traces import RequestSource


def scenario(**over: Any):
    """V3 on 8 x H200, TP8 + EP8, aggregated; ``over``: dotted keys of the scenario dict."""
    data: dict[str, Any] = {
        "name": "agg",
        "seed": 3,
        "model": "deepseek-v3",
        "serving": "aggregated",
        "pools": {
            "aggregated": {
                "instances": 1,
                "ep": 8,
                "tp": 8,
                "hardware": "h200",
                "max_tokens_per_step": 2048,
                "max_seqs_per_rank": 32,
            }
        },
        "policies": {"speculative": {"policy": "none"}, "eplb": {"imbalance": "constant"}},
        "workload": {"trace": "builtin:azure_conv", "max_requests": 150, "rate_scale": 0.5},
        "sim": {"progress": False},
    }
    for key, value in over.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return scenario_from_dict(data)


def run_capturing(sc, source=None):
    """simulate() and the cluster it built (to read the instance's step records)."""
    built: list[Cluster] = []
    result = simulate(sc, source=source, on_build=built.append)
    return result, built[0]


def instance(cl: Cluster) -> AggregatedInstance:
    inst = cl.decode[0]
    assert isinstance(inst, AggregatedInstance)
    return inst


def test_a_tiny_aggregated_run_serves_every_request_once():
    """Every arrival completes; the first token is out when the prompt's last chunk ends (no
    transfer: nothing moves between pools); the cost counts the 8 aggregated GPUs and nothing
    else; the summary reports the pool's busy time and the two sides of it."""
    result, cl = run_capturing(scenario())
    s = result.summary
    req = s["requests"]
    assert req["arrived"] == req["completed"] == 150
    assert req["rejected"] == req["in_flight"] == 0
    frame = result.requests
    np.testing.assert_array_equal(frame["t_first_token_s"], frame["t_prefill_end_s"])
    assert (frame["transfer_bytes"] == 0).all()
    assert (frame["decode_group"] == 0).all() and (frame["prefill_instance"] == 0).all()
    assert s["cost"]["gpus"] == {"vision": 0, "aggregated": 8, "total": 8}
    util = s["utilization"]
    assert 0 < util["prefill"] <= util["aggregated"] <= 1
    assert 0 < util["decode"] <= util["aggregated"]
    load = s["load"]["aggregated"]
    assert load["mixed_steps"] + load["decode_only_steps"] + load["prefill_only_steps"] == len(
        instance(cl).step_dt
    )
    assert s["prefill"]["compute_tokens"] == int(frame["input_tokens"].sum())  # no shared prefix


def test_decode_steps_that_carry_prefill_chunks_are_longer():
    """A request decoding 300 tokens alone steps at the pure decode pace. Long prompts arriving
    while it decodes ride in its steps as chunks: those steps take longer — the prefill stall —
    and its TPOT and largest ITL grow with them."""
    alone = make_source([0.0], 500, 300)
    busy = make_source([0.0, *np.linspace(0.3, 1.0, 8)], [500] + [6000] * 8, [300] + [1] * 8)
    a = simulate(scenario(), source=alone)
    b, cl_b = run_capturing(scenario(), source=busy)
    first_a, first_b = a.requests.iloc[0], b.requests.iloc[0]
    assert first_b["tpot_s"] > 1.3 * first_a["tpot_s"]
    assert first_b["itl_max_s"] > 3 * first_a["itl_max_s"]
    inst = instance(cl_b)
    dt = np.asarray(inst.step_dt)
    n = np.asarray(inst.step_n)
    chunks = np.asarray(inst.step_chunk_tokens)
    mixed = (n > 0) & (chunks > 0)
    pure = (n > 0) & (chunks == 0)
    assert mixed.sum() >= 8 and pure.sum() > 100
    assert dt[mixed].min() > dt[pure].max()
    stall = b.summary["load"]["aggregated"]["prefill_stall_s_mean"]
    assert stall == pytest.approx(dt[mixed].mean() - dt[pure].mean())


def test_tokens_per_step_never_exceed_the_budget():
    """Decode tokens first, chunks fill the rest: on a loaded instance no step runs more than
    ``max_tokens_per_step`` tokens on its rank, steps do fill up to it, and a prompt longer than
    the budget is split over several steps."""
    budget = 1024
    sc = scenario(**{"pools.aggregated.max_tokens_per_step": budget, "workload.rate_scale": 2.0})
    result, cl = run_capturing(sc)
    inst = instance(cl)
    most = np.asarray(inst.step_rank_tokens_max)
    assert most.max() == budget  # full steps exist, none over
    assert (most <= budget).all()
    frame = result.requests
    long = frame[frame["input_tokens"] > budget]
    assert len(long)
    # a prompt over the budget needs at least two steps: its prefill spans more than one step
    shortest_step = float(np.min(inst.step_dt))
    assert (long["t_prefill_end_s"] - long["t_prefill_start_s"] >= shortest_step).all()


def test_ttft_of_a_lone_request_is_its_chunk_steps():
    """One 5,000-token prompt, budget 2,048: three steps of 2,048, 2,048 and 904 tokens, each
    attending to what came before, back to back from its arrival. Its TTFT is exactly those
    three prefill steps' time (with nothing decoding, the mixed step is the prefill step)."""
    sc = scenario()
    result, cl = run_capturing(sc, source=make_source([0.0], 5000, 20))
    cost = instance(cl).cost
    imb = sc.policies.expert_imbalance.prefill
    chunks = [(2048, 0), (2048, 2048), (904, 4096)]
    expected = sum(cost.prefill_step([[c]], imb) for c in chunks)
    row = result.requests.iloc[0]
    assert row["ttft_s"] == pytest.approx(expected, rel=1e-12)
    assert row["t_prefill_start_s"] == 0.0
    assert instance(cl).step_chunk_tokens.tolist()[:3] == [2048, 2048, 904]
    assert result.summary["load"]["aggregated"]["prefill_only_steps"] == 3


def test_prefix_hits_shorten_prefill():
    """The same 6,000-token prompt twice, 5 s apart: the second finds all but its last partial
    block in the prefix cache, computes only the rest (one step instead of three) and gets its
    first token sooner, loading the hit first."""
    blocks = np.arange(12)  # 6,000 tokens in 512-token blocks: 11 full + 1 partial
    source = RequestSource.from_columns(
        arrival_s=np.array([0.0, 5.0]),
        input_len=np.array([6000, 6000]),
        output_len=np.array([2, 2]),
        block_offsets=np.array([0, 12, 24]),
        block_hashes=np.concatenate([blocks, blocks]),
        block_tokens=512,
        name="repeat",
    )
    result = simulate(scenario(), source=source)
    first, second = result.requests.iloc[0], result.requests.iloc[1]
    assert first["prefix_hit_tokens"] == 0
    assert second["prefix_hit_tokens"] == 11 * 512
    assert second["ttft_s"] < first["ttft_s"] / 2
    assert result.summary["prefill"]["compute_tokens"] == 6000 + (6000 - 11 * 512)
    off = scenario(**{"cache.prefix.enabled": False})
    plain = simulate(off, source=source).requests
    assert plain.iloc[1]["ttft_s"] == pytest.approx(plain.iloc[0]["ttft_s"], rel=1e-9)


def test_a_v4_prompt_replays_its_decoder_layers_with_its_last_chunk():
    """V4.1-Flash prefills through its prefill layers only and rebuilds the decoder layers' SWA
    state by replaying the prompt's last 128 tokens through them, in the step of its last chunk
    (as a prefill instance does): a lone 3,000-token prompt under a 2,048 budget takes two steps,
    the second carrying the replay, and its TTFT is exactly those two prefill steps."""
    sc = scenario(
        **{
            "model": "deepseek-v4.1-flash",
            "pools.aggregated.tp": 1,
            "pools.aggregated.hardware": "b200",
        }
    )
    result, cl = run_capturing(sc, source=make_source([0.0], 3000, 50))
    cost = instance(cl).cost
    imb = sc.policies.expert_imbalance.prefill
    expected = cost.prefill_step([[(2048, 0)]], imb) + cost.prefill_step(
        [[(952, 2048)]], imb, replay=[[(128, 3000 - 128)]]
    )
    row = result.requests.iloc[0]
    assert row["decoder_replay_tokens"] == 128
    assert row["ttft_s"] == pytest.approx(expected, rel=1e-12)
    assert result.summary["prefill"]["replay_tokens"] == 128
    # and with other requests decoding, the replay rides in mixed steps
    busy = make_source([0.0, *np.linspace(0.1, 0.5, 6)], 3000, [200] + [5] * 6)
    mixed = simulate(sc, source=busy).summary
    assert mixed["requests"]["completed"] == 7
    assert mixed["prefill"]["replay_tokens"] == 7 * 128
    assert mixed["load"]["aggregated"]["mixed_steps"] > 0


def test_kv_pressure_preempts_decoding_sequences_and_loses_none():
    """A rank with room for a few contexts only: under ``kv_policy: preempt`` the newest
    decoding sequences are dropped when the rank runs out and recompute their KV when
    readmitted; prompts wait for KV before they start. Every request still completes, and the
    end-of-run checks (KV within each rank's capacity, counted with the prompts) hold."""
    sc = scenario(
        **{
            "pools.aggregated.kv_policy": "preempt",
            "pools.aggregated.kv_hbm_fraction": 0.02,
            "workload.rate_scale": 2.0,
        }
    )
    result, cl = run_capturing(sc)
    s = result.summary
    assert s["requests"]["completed"] == 150
    assert s["decode"]["preemptions"] > 0
    assert instance(cl).check() == []


def test_same_seed_same_result():
    """Determinism: the same scenario twice gives the same summary and the same requests."""
    a = simulate(scenario(**{"policies.eplb.imbalance": "live"}))
    b = simulate(scenario(**{"policies.eplb.imbalance": "live"}))
    sa, sb = json.loads(a.summary_json()), json.loads(b.summary_json())
    sa["sim"].pop("wall_s")
    sb["sim"].pop("wall_s")
    assert sa == sb
    assert a.requests.equals(b.requests)
    assert sa["eplb"]["by_pool"]["aggregated"]["steps"] > 0


# ---- the mixed step's cost ---------------------------------------------------------------------


def roofline(ep: int, tp: int = 1, tbo: bool = False) -> RooflineStepCost:
    model = load_model("deepseek-v3").tp_slice(tp, 1)
    shape = PoolShape(ep, 0.0, tbo, tp=tp)
    return RooflineStepCost(model, load_hardware("h200"), shape, RooflineParams())


def packed(batch: list[float], kv: list[float]) -> np.ndarray:
    """Decode rows as a decode group keeps them (no drafts: tokens = batch)."""
    b, k = np.asarray(batch, dtype=float), np.asarray(kv, dtype=float)
    return np.stack([b, k, b, k])


def test_the_mixed_step_is_the_sum_of_its_parts():
    """One rank, no exchange: the step is its overhead, the prefill side's dense time, the
    decode side's beyond an idle rank's (the weights one forward reads once), and the routed
    experts over every token of the step."""
    cost = roofline(ep=1)
    chunks = [(1500, 3000)]
    load = packed([40.0], [40 * 2000.0])
    idle = float(cost.decode_dense(np.zeros(1), np.zeros(1), 1.0)[0])
    decode = float(cost.decode_dense(load[0], load[1], 1.0)[0])
    parts = (
        cost.step_overhead_s
        + cost.prefill_dense(chunks)
        + (decode - idle)
        + cost.moe_s(1500 + 40, "prefill")
    )
    assert cost.mixed_step([chunks], load) == pytest.approx(parts, rel=1e-12)
    # and less than the two steps run one after the other: the weights are read once
    apart = cost.prefill_step([chunks]) + cost.decode_step_packed(load)
    assert max(cost.prefill_step([chunks]), cost.decode_step_packed(load)) < parts < apart


@pytest.mark.parametrize("ep,tp,tbo", [(8, 8, False), (8, 1, False), (8, 1, True)])
def test_the_mixed_step_reduces_to_one_side_when_the_other_is_empty(ep, tp, tbo):
    """No chunks: exactly the decode step. No decode sequence: exactly the prefill step. Both:
    longer than either (TP8's one rank, DeepSeek's EP8 ranks, with two-batch overlap)."""
    cost = roofline(ep, tp, tbo)
    dp = ep // tp
    load = packed([30.0] * dp, [30 * 4000.0] * dp)
    chunks = [[(2048, 1024)]] + [[] for _ in range(dp - 1)]
    none: list[list[tuple[int, int]]] = [[] for _ in range(dp)]
    assert cost.mixed_step(none, load, 1.09) == cost.decode_step_packed(load, 1.09)
    assert cost.mixed_step(chunks, np.zeros((4, dp)), 1.07) == cost.prefill_step(chunks, 1.07)
    both = cost.mixed_step(chunks, load, 1.07)
    assert both > cost.decode_step_packed(load, 1.07)
    assert both > cost.prefill_step(chunks, 1.07)


def test_the_profile_cost_model_prices_a_mixed_step_too():
    """The calibrated profile gets the mixed step through the base class: V3 TP8 on the H200
    profile reduces to its own decode and prefill steps and is longer than either."""
    sc = scenario(**{"cost_model.aggregated": "h200-deepseek"})
    result, cl = run_capturing(sc)
    cost = instance(cl).cost
    assert type(cost).__name__ == "ProfileStepCost"
    load = packed([16.0], [16 * 3000.0])
    chunks = [[(1024, 512)]]
    assert cost.mixed_step([[]], load) == cost.decode_step_packed(load)
    assert cost.mixed_step(chunks, np.zeros((4, 1))) == cost.prefill_step(chunks)
    assert cost.mixed_step(chunks, load) > max(
        cost.decode_step_packed(load), cost.prefill_step(chunks)
    )
    assert result.summary["requests"]["completed"] == 150


# ---- configuration -----------------------------------------------------------------------------


def test_serving_aggregated_alone_gives_the_pool_its_defaults():
    """``serving: aggregated`` without ``pools.aggregated``: one instance of 8 H200 with the
    engines' defaults; the GPUs counted are its, not the disaggregated pools' defaults."""
    sc = scenario_from_dict({"serving": "aggregated", "model": "deepseek-v3"})
    assert sc.pools.aggregated is not None and sc.pools.aggregated.ep == 8
    assert sc.pools.gpus_by_pool() == {"vision": 0, "aggregated": 8}
    assert sc.hardware_kinds() == {"aggregated": "h200", "vision": "l40s"}
    plain = scenario_from_dict({"model": "deepseek-v3"})
    assert plain.serving == "disaggregated" and plain.pools.aggregated is None


@pytest.mark.parametrize(
    "data,key,says",
    [
        ({"pools": {"aggregated": {"ep": 8}}}, "pools.aggregated", "serving is disaggregated"),
        (
            {"serving": "aggregated", "pools": {"aggregated": {"ep": 8, "tp": 3}}},
            "pools.aggregated",
            "tp (3) must divide ep (8)",
        ),
        (
            {"serving": "aggregated", "pools": {"aggregated": {"batch": 8}}},
            "pools.aggregated.batch",
            "unknown key",
        ),
        ({"serving": "mixed"}, "serving", "'disaggregated' or 'aggregated'"),
        (
            {"serving": "aggregated", "pools": {"aggregated": {"ep": 16, "tp": 16}}},
            "pools.aggregated.tp",
            "scale-up domain",
        ),
        (
            {
                "serving": "aggregated",
                "faults": [{"kind": "link_cut", "at_s": 1, "duration_s": 1}],
            },
            "",
            "faults[0].kind: link_cut needs disaggregated serving",
        ),
    ],
)
def test_a_bad_aggregated_config_is_one_error_naming_its_key(data, key, says):
    """Each mistake is one ConfigError naming the dotted key and what is wrong."""
    with pytest.raises(ConfigError) as err:
        scenario_from_dict({"model": "deepseek-v3", **data})
    assert err.value.path == key
    assert says in str(err.value)


@pytest.mark.parametrize(
    "policy,says", [("none", "max_seqs_per_rank 32 = 32"), ("mtp1", "32 x (1 + 1 drafts")]
)
def test_a_token_budget_below_a_full_rank_of_decode_tokens_is_refused(policy, says):
    """Decode tokens go first: a budget that a full rank's decode tokens (1 + drafts each) could
    fill would starve its prompts, so the run is refused before it starts, naming the key."""
    sc = scenario(
        **{"pools.aggregated.max_tokens_per_step": 31, "policies.speculative.policy": policy}
    )
    with pytest.raises(ConfigError) as err:
        simulate(sc)
    assert err.value.path == "pools.aggregated.max_tokens_per_step"
    assert says in str(err.value)


# ---- the other schedules: SGLang's prefill first, whole prompts ----------------------------------


def _itl_adds_up(result, cl) -> None:
    """The per-step ITL samples are every gap a request saw between its tokens, exactly: one
    per token after the first (no speculation, no preemption here), summing to each request's
    time from its first token to its last — waits included — and each request's largest ITL is
    one of them."""
    from deepinfer_sim.sim.results.itl import itl_summary

    t = cl.table
    inst = instance(cl)
    end, dt, n, new = inst.step_table()
    w_row = np.asarray(inst.wait_row, dtype=np.int64)
    waits = np.asarray(inst.wait_s_before)
    decoded = np.flatnonzero(t.decode_first_step >= 0)
    assert (t.decode_last_step[decoded] >= 0).all()  # every one finished
    samples = int((n - new).sum()) + decoded.size  # a waited step's sample replaces one
    assert samples == int((t.output_len[decoded] - 1).sum())
    first_gaps = end[t.decode_first_step[decoded]] - t.t_transfer_end[decoded]
    total = float(((n - new) * dt).sum()) + float(waits.sum()) + float(first_gaps.sum())
    spans = float((t.t_done[decoded] - t.t_transfer_end[decoded]).sum())
    assert total == pytest.approx(spans, rel=1e-9)
    _, worst = itl_summary(t, [inst])
    if w_row.size:
        np.testing.assert_array_less(0.0, worst[np.asarray(inst.wait_rid)])
        w_rid = np.asarray(inst.wait_rid, dtype=np.int64)
        assert (worst[w_rid] >= dt[w_row] + waits - 1e-12).all()
    assert (worst[decoded] <= t.t_done[decoded] - t.t_transfer_end[decoded] + 1e-12).all()


def test_prefill_first_never_mixes_and_the_sequences_wait_out_the_prefill_steps():
    """SGLang's schedule: long prompts arriving while a request decodes get steps of their own
    (no step carries both), the whole budget each; the decoding request emits nothing in them,
    so its TPOT and its largest ITL grow by them, and its step records still add up end to
    end. Every request completes and the instance's invariants hold."""
    busy = make_source([0.0, *np.linspace(0.3, 1.0, 8)], [500] + [6000] * 8, [300] + [1] * 8)
    alone = make_source([0.0], 500, 300)
    sc = scenario(**{"pools.aggregated.scheduler": "prefill_first"})
    a = simulate(sc, source=alone)
    b, cl = run_capturing(sc, source=busy)
    load = b.summary["load"]["aggregated"]
    assert load["mixed_steps"] == 0 and load["prefill_only_steps"] >= 8
    assert load["wait_steps"] >= 8 and load["wait_s"] > 0
    assert b.summary["requests"]["completed"] == 9
    inst = instance(cl)
    assert inst.check() == []
    _itl_adds_up(b, cl)
    first_a, first_b = a.requests.iloc[0], b.requests.iloc[0]
    assert first_b["tpot_s"] > 1.3 * first_a["tpot_s"]
    assert first_b["itl_max_s"] >= load["prefill_only_step_s_mean"]
    # the chunks take the whole budget (no decode tokens beside them): full steps of 2,048
    chunks = [c for c in inst.step_chunk_tokens.tolist() if c]
    assert sum(chunks) == 500 + 8 * 6000 and max(chunks) == 2048
    assert chunks.count(2048) >= 48000 // 2048 - 8


@pytest.mark.parametrize("scheduler", ["tokens", "prefill_first"])
@pytest.mark.parametrize("tp", [8, 1])
def test_the_itl_samples_are_every_gap_under_either_schedule(scheduler, tp):
    """One attention rank (TP8) or eight (DP attention: under prefill_first a rank that
    prefills sits the step out while the others decode in it): the ITL rebuilt from the step
    records and the waits is exact, and nothing is lost."""
    sc = scenario(
        **{
            "pools.aggregated.scheduler": scheduler,
            "pools.aggregated.tp": tp,
            "pools.aggregated.max_seqs_per_rank": 32 if tp == 8 else 8,
            "workload.rate_scale": 2.0,
        }
    )
    result, cl = run_capturing(sc)
    assert result.summary["requests"]["completed"] == 150
    assert instance(cl).check() == []
    _itl_adds_up(result, cl)
    load = result.summary["load"]["aggregated"]
    if scheduler == "prefill_first":
        assert load["wait_steps"] > 0
        if tp == 8:  # one rank: a step that prefills decodes nothing
            assert load["mixed_steps"] == 0
        else:  # eight: other ranks decode while one prefills
            assert load["mixed_steps"] > 0


def test_whole_prompts_are_never_split():
    """``scheduler: whole``: a prompt goes into a step whole, beside the decode tokens, or waits
    for the next step; with the chunked default the same load splits prompts to fill steps."""
    source = make_source(np.linspace(0.0, 2.0, 40), 3000, 50)
    over = {"pools.aggregated.max_tokens_per_step": 8192}
    whole, cl_w = run_capturing(scenario(**over, **{"pools.aggregated.scheduler": "whole"}), source)
    _, cl_t = run_capturing(scenario(**over), source)
    assert whole.summary["requests"]["completed"] == 40
    per_step = np.asarray(instance(cl_w).step_chunk_tokens)
    assert per_step.max() > 3000 and (per_step % 3000 == 0).all()
    assert (np.asarray(instance(cl_t).step_chunk_tokens) % 3000 != 0).any()


def test_whole_prompts_longer_than_the_budget_are_refused_before_the_run():
    sc = scenario(**{"pools.aggregated.scheduler": "whole"})
    with pytest.raises(ConfigError) as err:
        simulate(sc, source=make_source([0.0, 1.0], [1000, 5000], 10))
    assert err.value.path == "pools.aggregated.max_tokens_per_step"
    assert "longest prompt (5,000 tokens)" in str(err.value)


@pytest.mark.parametrize("tp", [8, 1])
@pytest.mark.parametrize("kv_policy", ["reserve", "preempt"])
def test_prefill_first_with_mtp_and_kv_pressure_serves_everything(tp, kv_policy):
    """SGLang's schedule beside speculative decoding (MTP-1) and, under ``preempt``, a rank
    short of KV: every request completes, the instance's invariants hold, and without
    preemption each request's per-step gaps still add up to its first-to-last-token time."""
    over: dict[str, Any] = {
        "pools.aggregated.scheduler": "prefill_first",
        "pools.aggregated.tp": tp,
        "pools.aggregated.max_seqs_per_rank": 32 if tp == 8 else 8,
        "pools.aggregated.kv_policy": kv_policy,
        "policies.speculative.policy": "mtp1",
        "workload.rate_scale": 2.0,
    }
    if kv_policy == "preempt":
        over["pools.aggregated.kv_hbm_fraction"] = 0.02
    result, cl = run_capturing(scenario(**over))
    s = result.summary
    assert s["requests"]["completed"] == 150
    assert s["load"]["aggregated"]["wait_steps"] > 0
    inst = instance(cl)
    assert inst.check() == []
    if kv_policy == "preempt":
        assert s["decode"]["preemptions"] > 0
        return
    t = cl.table
    end, dt, n, new = inst.step_table()
    decoded = np.flatnonzero(t.decode_first_step >= 0)
    first_gaps = end[t.decode_first_step[decoded]] - t.t_transfer_end[decoded]
    total = float(((n - new) * dt).sum() + np.asarray(inst.wait_s_before).sum() + first_gaps.sum())
    spans = float((t.t_done[decoded] - t.t_transfer_end[decoded]).sum())
    assert total == pytest.approx(spans, rel=1e-9)
