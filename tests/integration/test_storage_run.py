"""The 3FS store inside cluster runs: same hits as the reference store when nothing expires,
failures degrade or lose blocks without losing requests, and the summary reports it all."""

from __future__ import annotations

import pytest

from deepinfer_sim import simulate
from deepinfer_sim.planner.analysis.ttl_sweep import ttl_sweep
from deepinfer_sim.traces.workload import build_source

STORE = {"pools.storage.nodes": 24}


def test_store_reports_traffic_and_matches_the_reference_store_without_expiry(tiny):
    reference = simulate(tiny())
    result = simulate(tiny(**STORE))
    assert reference.summary["storage"] is None
    s = result.summary["storage"]
    assert s["reads"] > 0 and s["writes"] > 0 and s["read_bytes"] > 0
    assert s["read_latency_s"]["p50"] > 0
    assert s["lost_blocks"] == 0 and s["expirations"] == 0
    hit = result.summary["cache"]["hit_rate_tokens"]
    assert hit == reference.summary["cache"]["hit_rate_tokens"] and hit > 0
    assert {"storage_used_frac", "storage_read_gbps"} <= set(result.timeseries.columns)


def test_short_ttl_expires_blocks_and_lowers_the_hit_rate(tiny):
    long = simulate(tiny(**STORE))
    short = simulate(tiny(**STORE, **{"pools.storage.ttl_s": {"chatbot": 5.0}}))
    assert short.summary["storage"]["expirations"] > 0
    assert short.summary["cache"]["hit_rate_tokens"] < long.summary["cache"]["hit_rate_tokens"]


def test_three_failed_nodes_of_a_group_lose_its_blocks_but_no_request(tiny):
    faults = [
        {"kind": "storage_node_fail", "at_s": 10.0, "duration_s": 1e4, "target": node}
        for node in (0, 1, 2)
    ]
    healthy = simulate(tiny(**STORE))
    failed = simulate(tiny(**STORE, faults=faults))
    s = failed.summary["storage"]
    assert s["node_failures"] == 3 and s["lost_blocks"] > 0
    assert failed.summary["requests"]["completed"] == healthy.summary["requests"]["completed"]
    lost_hits = healthy.summary["cache"]["hit_tokens"] - failed.summary["cache"]["hit_tokens"]
    assert lost_hits > 0


def test_two_failed_nodes_degrade_reads_and_lose_nothing(tiny):
    faults = [
        {"kind": "storage_node_fail", "at_s": 1.0, "duration_s": 1e4, "target": node}
        for node in (0, 1, 12, 13)
    ]
    healthy = simulate(tiny(**STORE))
    failed = simulate(tiny(**STORE, faults=faults))
    s = failed.summary["storage"]
    assert s["lost_blocks"] == 0 and s["degraded_reads"] > 0
    assert failed.summary["cache"]["hit_tokens"] == healthy.summary["cache"]["hit_tokens"]


def test_random_failures_and_repairs_rebuild(tiny):
    result = simulate(
        tiny(**STORE, **{"pools.storage.mtbf_h": 0.01, "pools.storage.mttr_h": 0.002})
    )
    s = result.summary["storage"]
    assert s["node_failures"] > 0 and s["rebuild_bytes"] > 0
    again = simulate(tiny(**STORE, **{"pools.storage.mtbf_h": 0.01, "pools.storage.mttr_h": 0.002}))
    assert again.summary["storage"] == s


@pytest.mark.parametrize("ttl_s", [5.0, 30.0, 120.0])
def test_one_pass_sweep_agrees_with_the_full_store_simulation(tiny, ttl_s):
    """The sweep's hit rate at a TTL equals the simulated store's within 0.5 percentage points
    (the store writes at prefill end, the sweep at arrival; on this trace they agree exactly)."""
    sc = tiny(**STORE, **{"pools.storage.ttl_s": {"chatbot": ttl_s}, "workload.max_requests": 400})
    simulated = simulate(sc).summary["cache"]["hit_rate_tokens"]
    frame = ttl_sweep(build_source(sc.workload, sc.seed), [ttl_s]).frame
    one_pass = frame[(frame["traffic_class"] == "all") & (frame["policy"] == "ttl")]["hit_rate"]
    assert simulated == pytest.approx(float(one_pass.iloc[0]), abs=0.005)
