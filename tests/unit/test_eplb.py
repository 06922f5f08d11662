"""EPLB placement (replicate, balanced packing, hierarchical, rank matching) and its invariants."""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_sim.sim.policies.eplb import (
    Placement,
    balanced_packing,
    match_ranks,
    moved_experts,
    rebalance,
    replicate,
    static_placement,
)


def skewed(layers: int = 6, experts: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.pareto(1.5, (layers, experts)) + 0.05


def rank_loads(p: Placement, weight: np.ndarray) -> np.ndarray:
    """(L, R) load per rank: each replica carries its expert's load / replicas."""
    layers = weight.shape[0]
    rows = np.arange(layers)[:, None]
    w = np.concatenate([weight, np.zeros((layers, 1))], axis=1)
    reps = np.concatenate([p.replicas, np.ones((layers, 1), np.int64)], axis=1)
    per_slot = w[rows, p.phy2log] / reps[rows, p.phy2log]
    return per_slot.reshape(layers, p.ranks, -1).sum(axis=2)


def check_placement(p: Placement, weight: np.ndarray) -> None:
    experts = weight.shape[1]
    counts = p.rank_counts(experts)
    # every rank has the same number of slots (by construction) and every one is used
    assert p.phy2log.shape[1] % p.ranks == 0
    assert (p.phy2log < experts).all()
    # every expert keeps at least one replica, and the replica table matches the slots
    per_expert = counts[:, :, :experts].sum(axis=1)
    assert (per_expert >= 1).all()
    np.testing.assert_array_equal(per_expert, p.replicas)
    # the load is conserved: the ranks together carry exactly the experts' load
    np.testing.assert_allclose(rank_loads(p, weight).sum(axis=1), weight.sum(axis=1), rtol=1e-9)


def test_replicate_gives_each_extra_slot_to_the_largest_load_per_replica() -> None:
    w = np.array([[10.0, 1.0, 1.0, 4.0]])
    reps = replicate(w, 7)
    np.testing.assert_array_equal(reps, [[3, 1, 1, 2]])  # 10/3, 4/2 vs the next: 10/4, 4/3
    assert reps.sum() == 7


def test_replicate_without_spare_slots_is_one_each() -> None:
    np.testing.assert_array_equal(replicate(np.ones((2, 5)), 5), np.ones((2, 5)))


def test_balanced_packing_fills_every_bin_equally_and_keeps_the_max_low() -> None:
    rng = np.random.default_rng(1)
    w = rng.uniform(0, 1, (5, 48))
    bins = balanced_packing(w, 8)
    for layer in range(5):
        counts = np.bincount(bins[layer], minlength=8)
        assert (counts == 6).all()
        loads = np.bincount(bins[layer], weights=w[layer], minlength=8)
        assert loads.sum() == pytest.approx(w[layer].sum())
        # greedy LPT with equal counts: within one item of perfect balance
        assert loads.max() <= w[layer].sum() / 8 + w[layer].max()


def test_balanced_packing_puts_the_heaviest_items_on_distinct_bins() -> None:
    w = np.array([[9.0, 8.0, 1.0, 1.0, 1.0, 1.0]])
    bins = balanced_packing(w, 2)[0]
    assert bins[0] != bins[1]


@pytest.mark.parametrize(("ranks", "redundant"), [(4, 4), (8, 1), (16, 0), (64, 1), (6, 2)])
def test_rebalance_invariants(ranks: int, redundant: int) -> None:
    w = skewed(experts=96)
    p = rebalance(w, ranks, redundant)
    assert p.slots_per_rank == -(-96 // ranks) + redundant
    check_placement(p, w)


def test_rebalance_beats_static_placement_on_skewed_load() -> None:
    w = skewed(layers=8, experts=64)
    static = static_placement(8, 64, 8, 1)
    check_static = rank_loads(static, w)
    eplb = rank_loads(rebalance(w, 8, 1), w)

    def imbalance(loads: np.ndarray) -> float:
        return float(loads.max(axis=1).sum() / loads.mean(axis=1).sum())

    assert imbalance(eplb) < imbalance(check_static)
    assert imbalance(eplb) < 1.1


def test_static_placement_is_contiguous_blocks_with_empty_redundant_slots() -> None:
    p = static_placement(2, 10, 4, 1)
    assert p.slots_per_rank == 4  # ceil(10/4) + 1
    np.testing.assert_array_equal(
        p.phy2log[0], [0, 1, 2, 10, 3, 4, 5, 10, 6, 7, 10, 10, 8, 9, 10, 10]
    )
    assert (p.replicas == 1).all()


def test_hierarchical_keeps_each_expert_group_inside_one_node() -> None:
    layers, experts, groups, nodes, ranks = 3, 64, 8, 2, 8
    w = skewed(layers, experts, seed=3)
    p = rebalance(w, ranks, 2, groups=groups, nodes=nodes)
    check_placement(p, w)
    per_node = ranks // nodes
    node_of_slot = np.arange(p.phy2log.shape[1]) // (p.slots_per_rank * per_node)
    for layer in range(layers):
        group_of_slot = p.phy2log[layer] // (experts // groups)
        for g in range(groups):
            assert np.unique(node_of_slot[group_of_slot == g]).size == 1
        # and every node holds the same number of groups
        nodes_of_groups = [node_of_slot[group_of_slot == g][0] for g in range(groups)]
        assert np.bincount(nodes_of_groups, minlength=nodes).tolist() == [groups // nodes] * nodes


def test_groups_that_do_not_divide_fall_back_to_global() -> None:
    w = skewed(2, 60)
    np.testing.assert_array_equal(
        rebalance(w, 4, 1, groups=3, nodes=2).phy2log, rebalance(w, 4, 1).phy2log
    )


def test_match_ranks_only_renumbers_and_never_moves_more() -> None:
    w = skewed(layers=5, experts=64, seed=4)
    old = rebalance(w, 8, 1)
    noisy = w * np.random.default_rng(5).uniform(0.7, 1.3, w.shape)
    new = rebalance(noisy, 8, 1)
    matched = match_ranks(old, new, 64)
    check_placement(matched, noisy)
    # the same packs, possibly on other ranks
    packs = lambda p: sorted(map(tuple, np.sort(p.phy2log.reshape(5, 8, -1), axis=2)[0]))  # noqa: E731
    assert packs(matched) == packs(new)
    assert moved_experts(old, matched, 64).sum() <= moved_experts(old, new, 64).sum()


def test_moving_to_the_same_placement_moves_nothing() -> None:
    p = rebalance(skewed(), 8, 1)
    assert moved_experts(p, p, 64).sum() == 0
    assert moved_experts(p, match_ranks(p, p, 64), 64).sum() == 0


def test_moved_experts_counts_what_each_rank_must_receive() -> None:
    old = Placement(np.array([[0, 1, 2, 3]]), np.ones((1, 4), np.int64), 2)
    new = Placement(np.array([[0, 2, 1, 3]]), np.ones((1, 4), np.int64), 2)
    np.testing.assert_array_equal(moved_experts(old, new, 4), [[1, 1]])


def test_rebalance_is_deterministic() -> None:
    w = skewed()
    np.testing.assert_array_equal(rebalance(w, 8, 1).phy2log, rebalance(w, 8, 1).phy2log)
