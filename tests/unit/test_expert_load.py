"""Expert-load model, rank moments and one EP group's EPLB window/period logic."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from deepinfer_sim.models.registry import load_model
from deepinfer_sim.scenario import EplbPool, ExpertLoad
from deepinfer_sim.sim.policies.eplb import rebalance, static_placement
from deepinfer_sim.sim.stages.expert_load import ExpertLoadModel, rank_moments
from deepinfer_sim.sim.stages.expert_parallel import GroupExperts, GroupShape

MODEL = load_model("deepseek-v4-flash")  # its first 3 MoE layers are hash-routed
CLASSES = ("chatbot", "coding")


def load_model_of(seed: int = 3, **cfg: Any) -> ExpertLoadModel:
    return ExpertLoadModel(ExpertLoad(**cfg), MODEL, CLASSES, seed)


def group(
    load: ExpertLoadModel,
    ranks: int = 8,
    redundant: int = 1,
    policy: str = "eplb",
    window: int = 5,
    period: int = 7,
    seed: int = 0,
) -> GroupExperts:
    shape = GroupShape(
        ranks=ranks,
        redundant_per_rank=redundant,
        layer_set=np.zeros(load.layers, dtype=np.int64),
        expert_bytes=1e6,
        move_bytes_per_s=1e9,
    )
    pool = EplbPool(policy=policy, window_steps=window, period_steps=period)
    return GroupExperts(load, pool, shape, np.random.default_rng(seed))


def one_class_tokens(c: int, n: float, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, Σt²) of a step of ``n`` single-token requests of class ``c``."""
    tok = np.zeros((classes, 1))
    tok[c, 0] = n
    return tok, tok.copy()


# -- the expert-load model --------------------------------------------------------------------


def test_popularity_is_normalized_and_hash_routed_layers_are_uniform() -> None:
    m = load_model_of()
    assert m.pop.shape == (2, m.layers, m.experts)
    assert np.allclose(m.pop.sum(axis=2), 1.0)
    hashed = MODEL.moe.hash_routed_layers
    assert hashed > 0 and m.hashed[:hashed].all() and not m.hashed[hashed:].any()
    assert np.allclose(m.pop[:, :hashed], 1.0 / m.experts)
    assert (m.het[:hashed] == 0).all() and (m.het[hashed:] > 0).all()
    # the learned layers are skewed: the busiest expert is well above uniform
    assert m.pop[:, hashed:].max(axis=2).min() > 2.0 / m.experts


def test_zipf_skew_orders_the_load() -> None:
    flat = load_model_of(skew=0.0, class_sigma=0.0, drift_sigma=0.0)
    steep = load_model_of(skew=0.8, class_sigma=0.0, drift_sigma=0.0)
    assert np.allclose(flat.pop, 1.0 / flat.experts)
    assert steep.pop.max() > 5.0 / steep.experts


def test_dirichlet_family_is_normalized_with_tiny_concentration() -> None:
    m = load_model_of(family="dirichlet", skew=0.01)
    assert np.isfinite(m.pop).all() and np.allclose(m.pop.sum(axis=2), 1.0)


def test_class_tilt_makes_classes_differ_only_when_asked() -> None:
    same = load_model_of(class_sigma=0.0)
    assert np.allclose(same.pop[0], same.pop[1])
    tilted = load_model_of(class_sigma=0.5)
    learned = MODEL.moe.hash_routed_layers
    assert not np.allclose(tilted.pop[0, learned:], tilted.pop[1, learned:])


def test_drift_path_depends_on_simulated_time_not_on_who_asks() -> None:
    a = load_model_of(drift_sigma=0.01)
    b = load_model_of(drift_sigma=0.01)
    a.advance(10.0)
    for t in np.arange(0.0, 10.0, 0.3):
        b.advance(float(t))
    b.advance(10.0)
    assert a.t_grid == b.t_grid == 10.0
    assert np.array_equal(a.pop, b.pop)
    assert a.version == 1 and b.version > 1  # b saw the intermediate snapshots


def test_drift_moves_popularity_and_zero_drift_never_does() -> None:
    moving = load_model_of(drift_sigma=0.05)
    before = moving.pop
    moving.advance(100.0)
    learned = MODEL.moe.hash_routed_layers
    assert moving.version == 1
    assert not np.allclose(before[:, learned:], moving.pop[:, learned:])
    assert np.allclose(before[:, :learned], moving.pop[:, :learned])  # hashed layers stay put
    still = load_model_of(drift_sigma=0.0)
    still.advance(100.0)
    assert still.version == 0


# -- rank moments ------------------------------------------------------------------------------


def test_rank_shares_sum_to_one_and_replication_lowers_the_poisson_variance() -> None:
    m = load_model_of()
    plain = static_placement(m.layers, m.experts, 8, 0)
    share, q2, bias = rank_moments(m.pop, plain.phy2log, plain.replicas, 8, m.het)
    assert share.shape == (2, m.layers, 8)
    assert np.allclose(share.sum(axis=2), 1.0)
    assert np.allclose(q2, share)  # one replica each: Poisson variance = mean
    assert (bias >= 0).all()
    g = group(m, ranks=8, redundant=2)
    share2, q2b, _ = g._moments
    assert np.allclose(share2.sum(axis=2), 1.0)
    assert (q2b <= share2 + 1e-12).all() and (q2b < share2 - 1e-9).any()


def test_rank_moments_match_a_slot_by_slot_sum_with_replicas_and_empty_slots() -> None:
    rng = np.random.default_rng(1)
    pop = rng.dirichlet(np.ones(16), size=(2, 3))
    place = rebalance(pop.mean(axis=0), 4, 2)
    share, q2, _ = rank_moments(pop, place.phy2log, place.replicas, 4, np.full(3, 0.1))
    spr = place.slots_per_rank
    ref, ref2 = np.zeros((2, 3, 4)), np.zeros((2, 3, 4))
    for layer, row in enumerate(place.phy2log):
        for slot, expert in enumerate(row):
            if expert < 16:
                rep = place.replicas[layer, expert]
                ref[:, layer, slot // spr] += pop[:, layer, expert] / rep
                ref2[:, layer, slot // spr] += pop[:, layer, expert] / rep**2
    assert np.allclose(share, ref) and np.allclose(q2, ref2)


def test_normal_moments_match_brute_force_dirichlet_multinomial_routing() -> None:
    """Per-request π ~ Dirichlet(κp), tokens multinomial(π): the rank load's mean and variance
    agree with rank_moments' mean + Poisson + request-bias variance."""
    rng = np.random.default_rng(7)
    experts, ranks, kappa = 16, 4, 10.0
    p = rng.dirichlet(np.full(experts, 2.0))
    place = static_placement(1, experts, ranks, 0)
    het = np.array([1.0 / (kappa + 1.0)])
    share, q2, bias = rank_moments(p[None, None, :], place.phy2log, place.replicas, ranks, het)
    requests, tokens, trials = 6, 50, 20000
    pi = rng.dirichlet(kappa * p, size=(trials, requests))
    counts = np.stack([rng.multinomial(tokens, row) for row in pi.reshape(-1, experts)])
    per_rank = counts.reshape(trials, requests, ranks, -1).sum(axis=(1, 3))
    mean = requests * tokens * share[0, 0]
    var = requests * tokens * q2[0, 0] + requests * tokens**2 * bias[0, 0]
    assert per_rank.mean(axis=0) == pytest.approx(mean, rel=0.02)
    # the model's Poisson term slightly overstates the multinomial's q(1 - q)
    assert per_rank.var(axis=0) == pytest.approx(var, rel=0.12)


# -- one group's EPLB window and period -------------------------------------------------------


def test_rebalances_exactly_every_period_after_a_random_phase() -> None:
    m = load_model_of()
    g = group(m, period=7, window=5)
    first = 7 - g.since
    tok, sq = one_class_tokens(0, 500.0)
    seen = []
    for step in range(1, 40):
        before = g.rebalances
        g.step(float(step) * 0.01, tok, sq)
        if g.rebalances > before:
            seen.append(step)
    assert seen[0] == first
    assert np.all(np.diff(seen) == 7)


def test_phase_differs_between_groups() -> None:
    m = load_model_of()
    phases = {group(m, period=1000, seed=s).since for s in range(8)}
    assert len(phases) > 1


def test_window_holds_only_the_last_steps() -> None:
    m = load_model_of(class_sigma=1.0, drift_sigma=0.0)
    g = group(m, window=5, period=10**6)
    for _ in range(20):
        g.step(0.0, *one_class_tokens(0, 1000.0))
    for _ in range(5):
        g.step(0.0, *one_class_tokens(1, 1000.0))
    assert len(g.window) == 5
    assert all(tok[0, 0] == 0 for _, tok, _ in g.window)
    loads = g.window_loads()
    learned = MODEL.moe.hash_routed_layers
    expected = 5 * 1000.0 * m.top_k * m.pop[1]
    # the sampled window load follows class 1's popularity, not class 0's
    err1 = np.abs(loads - expected)[learned:].mean()
    err0 = np.abs(loads - 5 * 1000.0 * m.top_k * m.pop[0])[learned:].mean()
    assert err1 < 0.5 * err0
    assert loads.sum() == pytest.approx(expected.sum(), rel=0.01)


def test_static_policy_never_rebalances() -> None:
    m = load_model_of()
    g = group(m, policy="static", period=3)
    tok, sq = one_class_tokens(0, 500.0)
    for step in range(30):
        g.step(float(step), tok, sq)
    assert g.rebalances == 0 and g.moved_bytes == 0 and not g.window


def test_factor_is_one_under_huge_uniform_load() -> None:
    m = load_model_of(skew=0.0, class_sigma=0.0, drift_sigma=0.0, request_concentration=1e9)
    g = group(m, policy="static")
    tok = np.array([[1e9], [0.0]])
    factors = [g.step(0.0, tok, tok.copy())[0] for _ in range(5)]
    assert factors == pytest.approx([1.0] * 5, abs=1e-3)


def test_eplb_beats_static_under_skewed_load() -> None:
    m = load_model_of(skew=0.8)
    tok, sq = one_class_tokens(0, 4000.0)
    eplb, static = group(m, ranks=16, redundant=1), group(m, ranks=16, policy="static")
    f_eplb = np.mean([eplb.step(0.0, tok, sq)[0] for _ in range(20)])
    f_static = np.mean([static.step(0.0, tok, sq)[0] for _ in range(20)])
    assert 1.0 < f_eplb < f_static


def test_rebalance_stall_is_the_busiest_receivers_bytes_over_the_link() -> None:
    m = load_model_of(skew=0.6)
    g = group(m, policy="eplb", period=3, window=3)
    g.place(static_placement(m.layers, m.experts, 8, 1))  # far from balanced
    tok, sq = one_class_tokens(0, 2000.0)
    stalls = [g.step(0.0, tok, sq)[1] for _ in range(6)]
    assert g.rebalances >= 1 and g.moved_experts > 0
    per_expert = g.shape.expert_bytes / g.shape.move_bytes_per_s
    # the busiest rank receives at least the average and at most everything that moved
    assert sum(stalls) == pytest.approx(g.stall_total_s)
    assert g.moved_experts * per_expert / 8 <= g.stall_total_s <= g.moved_experts * per_expert
    assert g.moved_bytes == g.moved_experts * g.shape.expert_bytes


def test_same_seed_same_factors() -> None:
    runs = []
    for _ in range(2):
        m = load_model_of(drift_sigma=0.01)
        g = group(m, period=4, window=3)
        tok, sq = one_class_tokens(1, 800.0)
        runs.append([g.step(float(t), tok, sq) for t in range(12)])
    assert runs[0] == runs[1]


def test_operating_point_comes_from_the_eplb_benchmark_config() -> None:
    from deepinfer_sim.planner.analysis.eplb_analysis import operating_point
    from deepinfer_sim.scenario import load_scenario

    sc = load_scenario("default", ["policies.eplb.benchmark.prefill_requests_per_rank=3"])
    assert operating_point(sc, "prefill", 4) == (3, 8192.0)
    assert operating_point(sc, "prefill", 4, 2, 100.0) == (2, 100.0)
    assert operating_point(sc, "decode", 64, tokens_per_request=4.5) == (60, 4.5)
