"""End-to-end runs on tiny scenarios: conservation, determinism and queueing sanity.

Each run replays a few hundred requests through a 2-instance prefill pool and one EP8 decode
group, so these finish in well under a second each while exercising every stage: arrival,
(vision,) prefill, the P->D link, lockstep decode and completion.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.sim.core.assemble import build_cluster


def test_every_request_is_accounted_for(tiny):
    """Conservation: arrived = completed + rejected + in flight, and the tables agree."""
    result = simulate(tiny())
    req = result.summary["requests"]
    assert req["arrived"] == 200
    assert req["completed"] + req["rejected"] + req["in_flight"] == req["arrived"]
    assert req["in_flight"] == 0  # no horizon: the run drains
    frame = result.requests
    done = frame[frame["state"] == "done"]
    assert len(done) == req["completed"]
    assert (done["t_done_s"] >= done["t_first_token_s"]).all()
    assert (done["t_first_token_s"] >= done["t_prefill_end_s"]).all()
    assert (done["t_prefill_end_s"] > done["t_prefill_start_s"]).all()
    assert (done["t_prefill_start_s"] >= done["arrival_s"]).all()
    assert int(result.summary["decode"]["steps"]) > 0


def test_same_seed_same_summary(tiny):
    """Determinism: two runs of one scenario give byte-identical summaries apart from wall time."""
    a = json.loads(simulate(tiny()).summary_json())
    b = json.loads(simulate(tiny()).summary_json())
    a["sim"].pop("wall_s")
    b["sim"].pop("wall_s")
    assert a == b


def test_different_seed_changes_the_arrival_spread(tiny):
    """The seed drives the spreading of Mooncake's 3-second timestamp buckets."""
    a = simulate(tiny(seed=1)).requests["arrival_s"].to_numpy()
    b = simulate(tiny(seed=2)).requests["arrival_s"].to_numpy()
    assert not np.allclose(a, b)


def test_horizon_leaves_requests_in_flight(tiny):
    """A run cut at a horizon reports the unfinished requests as in flight, not lost."""
    result = simulate(tiny(**{"sim.horizon_s": 5.0, "workload.rate_scale": 20.0}))
    req = result.summary["requests"]
    assert req["in_flight"] > 0
    assert req["completed"] + req["rejected"] + req["in_flight"] == req["arrived"]
    assert result.summary["sim"]["simulated_s"] == pytest.approx(5.0)


def test_prefill_utilization_matches_offered_load(tiny, synthetic):
    """Queueing sanity: with one-token outputs (prefill only) and Poisson arrivals, prefill
    busy time / wall time equals offered load: arrival rate × service time / instances."""
    sc = tiny(**{"pools.prefill.instances": 4})
    rng = np.random.default_rng(7)
    rate = 40.0
    arrivals = np.cumsum(rng.exponential(1 / rate, 4000))
    source = synthetic(arrivals, 4096, 1)
    cl = build_cluster(sc, source)  # to read the per-step cost of one 4096-token prompt
    replay = 128  # bounded decoder-layer SWA replay that rides with each prompt's last chunk
    service = cl.prefill[0].cost.prefill_step(
        [[(4096, 0)], []], sc.policies.expert_imbalance.prefill, replay=[[(replay, 4096 - replay)]]
    )
    result = simulate(sc, source=source)
    offered = rate * service / 4
    assert 0.2 < offered < 0.8  # a meaningful regime, neither idle nor saturated
    measured = result.summary["utilization"]["prefill"]
    # batching several queued prompts into one step makes service slightly cheaper per prompt
    assert measured == pytest.approx(offered, rel=0.1)
    assert result.summary["requests"]["completed"] == 4000


def test_decode_only_load_sets_tpot_from_the_step_cost(tiny, synthetic):
    """A single long request decodes alone: its TPOT is the one-sequence step time (with the
    constant expert imbalance the step cost is asked for: a live draw moves how many experts
    one token's step reaches)."""
    source = synthetic([0.0], 1000, 101)
    sc = tiny(**{"policies.speculative.policy": "none", "policies.eplb.imbalance": "constant"})
    result = simulate(sc, source=source)
    cl = build_cluster(sc, source)
    g = cl.decode[0]
    batch = np.zeros(g.ep)
    kv = np.zeros(g.ep)
    batch[0], kv[0] = 1, 1050  # mid-way context
    step = g.cost.decode_step(batch, kv, 1.0, sc.policies.expert_imbalance.decode)
    row = result.requests.iloc[0]
    assert row["tpot_s"] == pytest.approx(step, rel=0.02)
    assert row["itl_max_s"] >= row["tpot_s"] * 0.99


def test_rejections_carry_a_reason(tiny, synthetic):
    """A prompt longer than the model's context is rejected at arrival, with its reason."""
    source = synthetic([0.0, 0.1, 0.2], [1000, 2_000_000, 1000], 10)
    result = simulate(tiny(), source=source)
    assert result.summary["requests"]["rejected_by_reason"] == {"context_too_long": 1}
    assert result.requests.loc[1, "state"] == "rejected"
    assert result.summary["requests"]["completed"] == 2


def test_images_need_a_vision_encoder(tiny, synthetic):
    """Requests with images go through a VE instance; without one they are rejected."""
    source = synthetic([0.0, 0.5, 1.0], 2000, 20, images=[0, 2, 1])
    no_ve = simulate(tiny(), source=source)
    assert no_ve.summary["requests"]["rejected_by_reason"] == {"no_vision_encoder": 2}
    with_ve = simulate(tiny(**{"pools.vision.instances": 1}), source=source)
    frame = with_ve.requests
    assert with_ve.summary["requests"]["completed"] == 3
    assert frame.loc[0, "vision_instance"] == -1
    assert (frame.loc[1:, "t_vision_done_s"] > frame.loc[1:, "arrival_s"]).all()
    assert (frame.loc[1:, "t_prefill_start_s"] >= frame.loc[1:, "t_vision_done_s"]).all()


def test_transfer_time_follows_link_bandwidth(tiny, synthetic):
    """A lone transfer takes latency + bytes / (per-8-GPU budget scaled to the instance)."""
    source = synthetic([0.0], 64_000, 5)
    sc = tiny(**{"network.pd_gbps_per_8_gpus": 100.0, "cache.prefix.enabled": False})
    result = simulate(sc, source=source)
    row = result.requests.iloc[0]
    bw = 100e9 / 8 * sc.pools.prefill.ep / 8
    assert row["transfer_s"] == pytest.approx(sc.network.pd_latency_s + row["transfer_bytes"] / bw)
    # with the prefix cache on, the prompt's blocks are written back over the same egress link
    # at the same time, so the two flows share it and the transfer takes longer
    shared = simulate(tiny(**{"network.pd_gbps_per_8_gpus": 100.0}), source=source)
    assert shared.requests.iloc[0]["transfer_s"] > 1.5 * row["transfer_s"]


def test_default_scenario_runs_a_slice(tmp_path):
    """The bundled default scenario runs end to end and writes every output file."""
    sc = load_scenario("default", ["workload.max_requests=300", "workload.repeat=1"])
    result = simulate(sc)
    out = result.write(tmp_path / "run")
    for name in ("summary.json", "requests.parquet", "timeseries.parquet", "config.resolved.yaml"):
        assert (out / name).is_file()
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "latency_cdf.png",
        "timeseries.png",
    ]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["completed"] == 300
    assert summary["latency"]["ttft_s"]["p50"] > 0
