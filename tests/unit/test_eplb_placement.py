"""EPLB placement policies, each driven directly with a placement and a window of expert loads:
no cluster, no expert-load model, no EP group. Four ranks, eight experts, one redundant slot per
rank, two MoE layers; the window's loads make expert 0 hot.
"""

from __future__ import annotations

from typing import get_args

import numpy as np
import pytest

from deepinfer_sim.errors import ConfigError
from deepinfer_sim.scenario import EplbPool
from deepinfer_sim.sim.policies.eplb import (
    EXPERT_PLACEMENT,
    ExpertPlacement,
    Rebalancing,
    StaticPlacement,
    make_expert_placement,
    moved_experts,
    static_placement,
)
from deepinfer_sim.sim.stages.expert_parallel import GroupShape

LAYERS, EXPERTS, RANKS = 2, 8, 4
SHAPE = GroupShape(
    ranks=RANKS,
    redundant_per_rank=1,
    layer_set=np.zeros(LAYERS, dtype=np.int64),
    expert_bytes=1e6,
    move_bytes_per_s=1e9,
)
STATIC = static_placement(LAYERS, EXPERTS, RANKS, 1)
SKEWED = np.tile([40.0, 8, 7, 6, 5, 4, 3, 2], (LAYERS, 1))  # (L, E) window loads


def cfg(policy: str = "eplb", **kw) -> EplbPool:
    return EplbPool(policy=policy, window_steps=5, period_steps=7, **kw)


def never_called() -> np.ndarray:
    raise AssertionError("the expected load was not needed")


def test_static_keeps_its_blocks_and_never_moves():
    """No window, no random phase, never due; even asked, it places nothing new."""
    p: ExpertPlacement = make_expert_placement(cfg("static"), SHAPE)
    assert isinstance(p, StaticPlacement) and p.window_steps == 0
    assert p.initial(STATIC, never_called) is STATIC
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    assert p.phase(rng) == 0 and rng.bit_generator.state == state  # drew nothing
    assert not any(p.due(since) for since in range(100))
    assert not moved_experts(STATIC, p.place(STATIC, SKEWED), EXPERTS).any()


def test_rebalancing_is_due_after_its_period_from_a_random_phase():
    p = make_expert_placement(cfg(), SHAPE)
    assert isinstance(p, Rebalancing) and p.window_steps == 5
    phases = {p.phase(np.random.default_rng(s)) for s in range(20)}
    assert phases <= set(range(7)) and len(phases) > 1  # groups do not rebalance in step
    assert [p.due(since) for since in (0, 6, 7, 8)] == [False, False, True, True]


def test_rebalancing_replicates_the_hot_expert_and_moves_weights():
    """From the static blocks (redundant slots empty), a skewed window gives the hot expert the
    spare replicas and moves experts between ranks."""
    new = make_expert_placement(cfg(), SHAPE).place(STATIC, SKEWED)
    assert (new.replicas[:, 0] > 1).all()
    assert (new.replicas.sum(axis=1) == RANKS * STATIC.slots_per_rank).all()
    assert moved_experts(STATIC, new, EXPERTS).sum() > 0


def test_minimize_moves_keeps_experts_where_they_are():
    keep = make_expert_placement(cfg(minimize_moves=True), SHAPE).place(STATIC, SKEWED)
    free = make_expert_placement(cfg(minimize_moves=False), SHAPE).place(STATIC, SKEWED)
    assert (keep.replicas == free.replicas).all()  # the same packs, renumbered onto ranks
    assert moved_experts(STATIC, keep, EXPERTS).sum() <= moved_experts(STATIC, free, EXPERTS).sum()


def test_warm_start_begins_from_the_expected_load():
    warm = make_expert_placement(cfg(warm_start=True), SHAPE).initial(STATIC, lambda: SKEWED)
    assert (warm.replicas[:, 0] > 1).all()
    cold = make_expert_placement(cfg(warm_start=False), SHAPE)
    assert cold.initial(STATIC, never_called) is STATIC


def test_registry_covers_the_config_tags_and_refuses_others():
    assert set(EXPERT_PLACEMENT) == set(get_args(EplbPool.model_fields["policy"].annotation))
    bogus = cfg().model_copy(update={"policy": "oracle"})  # past the config's validation
    with pytest.raises(ConfigError, match="unknown EPLB policy 'oracle'"):
        make_expert_placement(bogus, SHAPE)
