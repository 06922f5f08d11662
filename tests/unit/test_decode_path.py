"""The decode path: lockstep timing, KV admission, verify policies, the 2-D balancer and link
cuts on the P->D transfer (SPEC.md §2.1, §2.4, §2.7).
"""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_sim import simulate
from deepinfer_sim.planner.analysis.offline import steady_throughput
from deepinfer_sim.scenario import Speculative
from deepinfer_sim.sim.core.assemble import build_cluster
from deepinfer_sim.sim.policies.balancer import TwoDimBalancer
from deepinfer_sim.sim.policies.speculative import (
    ClassAcceptance,
    PolicyParts,
    SpecDecoder,
    make_verify_policy,
)


def decode_only(tiny, synthetic, inputs, outputs, **over):
    sc = tiny(**{"cache.prefix.enabled": False, "policies.speculative.policy": "none", **over})
    n = len(inputs)
    return sc, synthetic(np.zeros(n), inputs, outputs)


def test_lockstep_step_is_set_by_the_slowest_rank(tiny, synthetic):
    """Two requests on one rank and a long-context request on another: every step of the
    group costs what the cost model says for the ranks' rows, i.e. the slowest rank's time."""
    sc, src = decode_only(tiny, synthetic, [1000, 1000, 60_000], [40, 40, 40])
    cl = build_cluster(sc, src)
    g = cl.decode[0]
    load = np.zeros((4, g.ep))
    load[0, 0], load[1, 0] = 2, 2000
    load[0, 1], load[1, 1] = 1, 60_000
    load[2], load[3] = load[0], load[1]
    both = g.cost.decode_step_packed(load, 1.0)
    only_short = load.copy()
    only_short[:, 1] = 0
    assert both > g.cost.decode_step_packed(only_short, 1.0)


def test_kv_admission_never_exceeds_capacity_and_requests_wait(tiny, synthetic):
    """With room for one request's KV per rank, the second request routed to the same rank waits
    for the first to finish; no rank ever holds more KV than it has."""
    sc, src = decode_only(tiny, synthetic, [5000, 5000], [20, 20])
    cl = build_cluster(sc, src)
    g = cl.decode[0]
    g.kv_capacity = 5000.0 + 20 + g.seq_overhead + 1  # exactly one request fits
    for d in cl.decode:  # route both to rank 0
        d.assigned[1:] = 10**6
    cl.env.run(until=600.0)  # the tier router's rounds never end: run to a horizon
    t = cl.table
    assert np.isfinite(t.t_done).all() and (t.decode_rank == 0).all()
    first, second = np.argsort(t.t_decode_start)
    assert t.t_decode_start[second] >= t.t_done[first]  # waited for the KV to free up
    g.assigned[1:] = 0
    assert (g.reserved <= g.kv_capacity + 1e-6).all() and g.check() == []


def spec(policy: str, k: int = 5, sigma: float = 0.0, lag: int = 0) -> SpecDecoder:
    cfg = Speculative(
        policy=policy,
        max_draft_tokens=k,
        fixed_k=k,
        lag_steps=lag,
        confidence_noise=sigma,
        overhead_s=0.0,
        retune_steps=1,
    )
    rng = np.random.default_rng(0)
    return SpecDecoder(
        policy=make_verify_policy(cfg, PolicyParts(k, 1000, rng)),
        classes=[ClassAcceptance(0.7, 4.0, 1.0)],
        capacity=1000,
        rng=rng,
    )


def flat_step(extra: float) -> float:
    return 0.01  # verify tokens cost nothing: verifying more can only help


@pytest.mark.parametrize(("policy", "verify"), [("none", 0), ("mtp1", 1), ("fixed", 5)])
def test_fixed_verify_policies(policy, verify):
    s = spec(policy)
    for i in range(100):
        s.admit(i, 0)
    live = np.ones(100, dtype=bool)
    v = s.choose(100, live, flat_step)
    assert (v == verify).all()
    emitted = s.accept(100, live, np.full(100, 10**6))
    assert (emitted >= 1).all() and (emitted <= verify + 1).all()


def test_fixed_acceptance_matches_the_beta_moments():
    """fixed-5 emits 1 + Σ_j E[α^j] tokens per sequence-step on average (δ = 1)."""
    s = spec("fixed")
    n = 1000
    for i in range(n):
        s.admit(i, 0)
    live = np.ones(n, dtype=bool)
    total = 0.0
    for _ in range(40):
        s.choose(n, live, flat_step)
        total += float(s.accept(n, live, np.full(n, 10**6)).mean())
    a, b = 0.7 * 4, 0.3 * 4
    expected, m = 1.0, 1.0
    for j in range(1, 6):
        m *= (a + j - 1) / (a + b + j - 1)
        expected += m
    assert total / 40 == pytest.approx(expected, rel=0.03)


def test_dspark_verifies_all_when_verification_is_free_and_less_when_it_costs():
    s = spec("dspark", sigma=0.3)
    for i in range(200):
        s.admit(i, 0)
    live = np.ones(200, dtype=bool)
    free = s.choose(200, live, flat_step).copy()
    assert free.mean() > 4.5

    def dear(extra: float) -> float:
        return 0.01 + extra * 1e-4  # each verify token costs 1 % of a step

    assert s.choose(200, live, dear).mean() < free.mean() - 1
    assert (s.choose(200, np.zeros(200, dtype=bool), dear) == 0).all()  # holes verify nothing


def test_dspark_end_to_end_reports_verify_and_acceptance(tiny):
    """In a steady decode run the summary numbers move the way the article says: fewer tokens
    verified than fixed-5, about as many accepted."""
    fixed = steady_throughput(tiny(**{"policies.speculative.policy": "fixed"}), 32, steps=60)
    dspark = steady_throughput(tiny(**{"policies.speculative.policy": "dspark"}), 32, steps=60)
    assert fixed.verify_tokens_per_seq_step == pytest.approx(5.0)
    assert dspark.verify_tokens_per_seq_step < 5.0
    assert dspark.accepted_tokens_per_seq_step > 0.85 * fixed.accepted_tokens_per_seq_step


def test_two_dim_balancer_sends_short_to_idle_ranks_and_long_to_small_caches(tiny, synthetic):
    sc, src = decode_only(tiny, synthetic, [1000, 500_000], [10, 10], **{"pools.decode.ep": 3})
    cl = build_cluster(sc, src)
    g = cl.decode[0]
    # rank 0: few requests, long caches; rank 1: many requests, small caches; rank 2: medium
    g.assigned[:] = [2, 10, 6]
    g.assigned_kv[:] = [400_000, 40_000, 200_000]
    bal = TwoDimBalancer(cl.decode, 16384)
    assert bal.choose(0) == (0, 0)  # short: the low-concurrency rank, long cache or not
    assert bal.choose(1) == (0, 1)  # long: the rank with the smallest cache


def test_link_cut_delays_transfers_until_repair_or_reroutes(tiny, synthetic):
    """A 2 s cut of the only P->D link in the middle of a transfer delays it by 2 s (TTFT grows);
    with a backup path the transfer moves there and is not delayed by the cut."""
    base = {
        "cache.prefix.enabled": False,
        "pools.prefill.instances": 1,
        "network.pd_gbps_per_8_gpus": 1.0,
    }
    src = synthetic([0.0], 64_000, 5)
    calm = simulate(tiny(**base), source=src).requests.iloc[0]
    start = calm["t_prefill_end_s"] + 0.1
    fault = [{"kind": "link_cut", "at_s": float(start), "duration_s": 2.0, "target": 0}]
    cut = simulate(tiny(**base, faults=fault), source=src)
    assert cut.requests.iloc[0]["transfer_s"] == pytest.approx(calm["transfer_s"] + 2.0, rel=1e-6)
    assert cut.requests.iloc[0]["ttft_s"] == pytest.approx(calm["ttft_s"] + 2.0, rel=1e-6)
    rerouted = simulate(tiny(**base, faults=fault, **{"network.backup_links": True}), source=src)
    assert rerouted.summary["transfer"]["rerouted"] == 1
    assert rerouted.requests.iloc[0]["transfer_s"] == pytest.approx(calm["transfer_s"], rel=1e-3)


def test_preemption_frees_kv_counts_and_loses_nothing(tiny, synthetic):
    """Under ``kv_policy: preempt`` a rank admits on the current context and grows; when the KV
    runs out, its newest sequences are dropped, counted, and recompute when readmitted — every
    request still completes, with exactly its output tokens, and KV never exceeds capacity."""
    sc, src = decode_only(
        tiny,
        synthetic,
        [4000, 4000, 4000],
        [400, 400, 400],
        **{"pools.decode.kv_policy": "preempt"},
    )
    cl = build_cluster(sc, src)
    g = cl.decode[0]
    g.assigned[1:] = 10**6  # route all three to rank 0
    # room for the three prompts and about half of their outputs
    g.kv_capacity = 3 * (4000 + g.seq_overhead) + 600
    peak = []
    end_step = g.end_step

    def watched(dt: float) -> None:
        end_step(dt)
        peak.append(float(g.reserved.max()))

    g.end_step = watched
    cl.env.run(until=600.0)
    t = cl.table
    assert np.isfinite(t.t_done).all()
    assert g.preemptions > 0 and int(t.preemptions.sum()) == g.preemptions
    assert g.recompute_s > 0
    assert max(peak) <= g.kv_capacity + 1e-6
    assert g.tokens_out == int((t.output_len - 1).sum())  # no token lost or duplicated
    g.assigned[1:] = 0
    assert g.check() == []


def test_reserve_policy_never_preempts(tiny, synthetic):
    sc, src = decode_only(tiny, synthetic, [4000] * 3, [400] * 3)
    res = simulate(sc, source=src)
    assert res.summary["decode"]["preemptions"] == 0


def test_a_failed_rank_sends_its_requests_elsewhere_and_loses_none(tiny, synthetic):
    """Rank 0 of the decode group fails mid-run: its requests move to live ranks (counted),
    recompute their KV there, keep the tokens they had, and all complete; while it is down no
    request is routed to it."""
    n = 40
    src = synthetic(np.linspace(0, 2, n), 3000, 300)
    sc = tiny(
        **{
            "cache.prefix.enabled": False,
            "faults": [
                {"kind": "rank_fail", "at_s": 2.0, "duration_s": 30.0, "target": 0, "rank": 0}
            ],
        }
    )
    res = simulate(sc, source=src)
    d = res.summary["decode"]
    assert res.summary["requests"]["completed"] == n
    assert d["rank_failures"] == 1 and d["requeued_after_failure"] > 0
    assert d["recompute_s"] > 0
    frame = res.requests
    moved = frame["rank_failures"] > 0
    assert moved.sum() == d["requeued_after_failure"]
    assert (frame.loc[moved, "decode_rank"] != 0).all()  # finished on a live rank


def test_rank_fault_targets_are_validated(tiny):
    from deepinfer_sim.errors import ConfigError

    with pytest.raises(ConfigError, match="rank 99 does not exist"):
        tiny(faults=[{"kind": "rank_fail", "at_s": 1, "duration_s": 1, "target": 0, "rank": 99}])
