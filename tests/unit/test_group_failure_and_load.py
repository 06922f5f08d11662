"""A whole decode group failing, and load metrics that say how full the pools are.

Every rank of a Wide-EP group can fail at once (``faults: rank_fail`` for each rank). Its
requests then have nowhere to go in that group: they move to another live group when there is
one, wait for the first repair when there is not (``decode.parked_no_live_rank``), and are
rejected with the reason ``no_decode_rank`` when no repair will come (a fault with an infinite
duration, which only the API can build: configs must be finite).
The run always finishes and writes its summary.

Utilization is busy time over the window the run covers, so it never exceeds 1 — in the summary
and in every time-series interval. Busy is not full, so ``load`` adds occupancy (sequences and KV
per decode rank against their limits, tokens per prefill step against the budget) and queue
depths per pool.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepinfer_sim import load_scenario, simulate
from deepinfer_sim.scenario import Fault


def whole_group(group: int, ranks: int, at_s: float, duration_s: float) -> list[dict]:
    return [
        {"kind": "rank_fail", "at_s": at_s, "duration_s": duration_s, "target": group, "rank": r}
        for r in range(ranks)
    ]


@pytest.mark.parametrize("balancer", ["two_dim", "least_requests", "round_robin"])
def test_the_only_group_failing_waits_for_its_repair_and_finishes(tiny, synthetic, balancer):
    """All 8 ranks of the only group fail at 2 s for 5 s: the requests they held and those
    prefilled meanwhile wait for the repair, then all complete; nothing is lost or rejected."""
    n = 40
    src = synthetic(np.linspace(0, 4, n), 3000, 300)
    sc = tiny(
        **{
            "cache.prefix.enabled": False,
            "policies.decode_balancer": balancer,
            "faults": whole_group(0, 8, 2.0, 5.0),
        }
    )
    res = simulate(sc, source=src)
    s = res.summary
    assert s["requests"]["completed"] == n and s["requests"]["rejected"] == 0
    d = s["decode"]
    assert d["rank_failures"] == 8 and d["group_outages"] == 1
    assert d["parked_no_live_rank"] > 0 and d["parked_at_end"] == 0
    frame = res.requests
    moved = frame["rank_failures"] > 0
    # a request can be moved more than once (its new rank fails in the same instant)
    assert frame.loc[moved, "rank_failures"].sum() == d["requeued_after_failure"] > 0
    # nothing decodes while the group is down: no request completes between 2 s and 7 s
    done = frame["t_done_s"]
    assert not ((done > 2.0 + 1e-9) & (done < 7.0 - 1e-9)).any()
    assert res.timeseries["decode_parked"].max() > 0


def test_the_only_group_failing_for_good_rejects_with_a_reason(tiny, synthetic):
    """No repair and no other group: the requests it held and every later one are rejected as
    ``no_decode_rank``; the ones that finished before the failure stay completed."""
    n = 30
    src = synthetic(np.linspace(0, 6, n), 2000, 50)
    sc = tiny(**{"cache.prefix.enabled": False})
    forever = tuple(Fault.model_construct(**f) for f in whole_group(0, 8, 3.0, math.inf))
    sc = sc.model_copy(update={"faults": forever})  # configs cannot say .inf; the API can
    s = simulate(sc, source=src).summary
    req = s["requests"]
    assert req["in_flight"] == 0 and req["completed"] > 0
    assert req["rejected_by_reason"] == {"no_decode_rank": req["rejected"]}
    assert req["completed"] + req["rejected"] == n
    assert s["decode"]["group_outages"] == 1 and s["decode"]["parked_no_live_rank"] == 0


def test_a_group_failing_sends_its_requests_to_the_other_group(tiny, synthetic):
    """With two groups, group 0 failing for the rest of the run moves its requests to group 1,
    where they all complete: nothing waits for the repair and nothing is rejected."""
    n = 40
    src = synthetic(np.linspace(0, 4, n), 3000, 300)
    sc = tiny(
        **{
            "cache.prefix.enabled": False,
            "pools.decode.groups": 2,
            "faults": whole_group(0, 8, 2.0, 1000.0),
        }
    )
    res = simulate(sc, source=src)
    s = res.summary
    assert s["requests"]["completed"] == n and s["requests"]["rejected"] == 0
    assert s["decode"]["parked_no_live_rank"] == 0 and s["decode"]["requeued_after_failure"] > 0
    late = res.requests["arrival_s"] > 2.5  # prefilled after the failure
    assert (res.requests.loc[late, "decode_group"] == 1).all()


@pytest.fixture(scope="module")
def default_small():
    """The default deployment (16 EP4 prefill + one EP64 decode group, live EPLB, 3FS store)
    on 300 requests, cut by a horizon mid-run, sampled every 0.1 s."""
    sc = load_scenario(
        "default",
        [
            "sim.progress=false",
            "workload.max_requests=300",
            "sim.horizon_s=6",
            "sim.timeseries_interval_s=0.1",
        ],
    )
    return simulate(sc)


def test_busy_fraction_never_exceeds_one(default_small):
    s = default_small.summary
    for pool in ("prefill", "decode"):
        assert 0 < s["utilization"][pool] <= 1
        assert s["load"][pool]["busy_fraction"] == s["utilization"][pool]
    ts = default_small.timeseries
    for col in ("prefill_util", "decode_util", "vision_util"):
        assert (ts[col] >= 0).all() and (ts[col] <= 1).all(), col
    # the window runs from the first arrival to the horizon, not to the last completion
    assert s["sim"]["simulated_s"] == 6.0
    assert s["throughput"]["duration_s"] <= s["load"]["window_s"] <= 6.0


def test_occupancy_and_queue_depths_are_reported_and_sane(default_small):
    s = default_small.summary
    load, dec = s["load"], s["load"]["decode"]
    assert dec["max_seqs_per_rank"] == 256
    assert 0 < dec["seqs_per_rank_mean"] <= dec["seqs_per_rank_while_busy"] <= 256
    assert dec["batch_fill"] == pytest.approx(dec["seqs_per_rank_mean"] / 256)
    assert 0 < dec["kv_used_fraction_mean"] <= dec["kv_reserved_fraction_mean"] <= 1
    assert dec["kv_tokens_per_rank_mean"] == pytest.approx(
        dec["kv_used_fraction_mean"] * dec["kv_capacity_tokens_per_rank"]
    )
    # busy is not full: the group steps almost all the time with about one sequence per rank
    assert dec["busy_fraction"] > 0.5 and dec["batch_fill"] < 0.1
    pre = load["prefill"]
    assert pre["step_token_budget"] == 32768 * 4
    assert 0 < pre["tokens_per_step_mean"] <= pre["step_token_budget"]
    assert 0 < pre["step_token_fill"] <= 1 and 0 < pre["step_s_mean"] <= 1.0 + 1e-9
    for q in (pre["queue"], dec["queue"], dec["parked_queue"], load["transfer"]["queue"]):
        assert 0 <= q["mean"] <= q["max"] and q["p99"] <= q["max"]
    assert pre["queue"]["max"] > 0 and dec["parked_queue"]["max"] == 0


def test_a_horizon_cut_counts_the_requests_it_left_out():
    """sim.horizon_s stops a run with prompts still loading their cached prefix (they are at
    their prefill instance, not pending) and says how many requests never arrived."""
    sc = load_scenario("default", ["sim.horizon_s=4"])
    req = simulate(sc).summary["requests"]
    assert req["in_workload"] == req["not_arrived"] + req["arrived"]
    assert req["not_arrived"] > 0 and req["in_flight"] > 0
    assert req["arrived"] == req["completed"] + req["rejected"] + req["in_flight"]
