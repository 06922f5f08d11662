"""The drafter's time in a decode step (models/draft.py): MTP chains and block drafters."""

from __future__ import annotations

import numpy as np
import pytest

from deepinfer_sim.models.cost import PoolShape, RooflineParams, RooflineStepCost, StepParams
from deepinfer_sim.models.draft import DraftCost
from deepinfer_sim.models.registry import load_hardware, load_model
from deepinfer_sim.planner.analysis import offline
from deepinfer_sim.planner.analysis.steady import decode_point
from deepinfer_sim.scenario import load_scenario


def packed(ep: int, batch: float, context: float, verify: float) -> np.ndarray:
    b, kv = np.full(ep, batch), np.full(ep, batch * context)
    return np.stack((b, kv, b * verify, kv * verify))


def v3_cost(ep: int = 144, comm_overlap: float = 0.0) -> RooflineStepCost:
    return RooflineStepCost(
        load_model("deepseek-v3"),
        load_hardware("h800"),
        PoolShape(ep, 0.0),
        RooflineParams(),
        StepParams(comm_overlap=comm_overlap),
    )


def test_the_drafter_follows_the_model_file() -> None:
    """V3's MTP module is one layer run once per draft; V4-Flash's DSpark drafter three layers
    over a block of drafts in one pass; a drafter of unstated size, or no drafts, costs nothing."""
    v3, v4 = load_model("deepseek-v3"), load_model("deepseek-v4-flash")
    assert DraftCost.of(v3, 1) == DraftCost(passes=1, rows=1, share=1 / 61)
    assert DraftCost.of(v3, 3) == DraftCost(passes=3, rows=1, share=1 / 61)
    assert DraftCost.of(v4, 5) == DraftCost(passes=1, rows=5, share=3 / 43)
    assert DraftCost.of(load_model("deepseek-v4.1-flash"), 5) is None
    assert DraftCost.of(v3, 0) is None


def test_a_drafter_as_deep_as_the_target_costs_a_step_at_its_rows() -> None:
    """The definition: a pass of every layer at one row per sequence is the target's step at
    verify 1, less the step overhead; an MTP chain of d drafts pays d such passes."""
    cost = v3_cost()
    load = packed(144, 64, 4096, 2.0)
    step_at_one = cost.decode_step_packed(packed(144, 64, 4096, 1.0)) - cost.step_overhead_s
    assert DraftCost(1, 1, 1.0).step_s(cost, load[0], load[1], 1.0) == pytest.approx(step_at_one)
    assert DraftCost(3, 1, 0.5).step_s(cost, load[0], load[1], 1.0) == pytest.approx(
        1.5 * step_at_one
    )


def test_a_block_pass_reads_the_weights_once() -> None:
    """At a small batch a decode layer is bound by its weights: five drafts in one block pass
    cost less than five chained passes, and (on the roofline, all memory-bound, the exchange
    hidden) no more than one."""
    cost = v3_cost(comm_overlap=1.0)
    load = packed(144, 4, 2048, 1.0)
    chain, block = DraftCost(5, 1, 0.1), DraftCost(1, 5, 0.1)
    one = DraftCost(1, 1, 0.1).step_s(cost, load[0], load[1], 1.0)
    assert one == pytest.approx(block.step_s(cost, load[0], load[1], 1.0))
    assert block.step_s(cost, load[0], load[1], 1.0) < chain.step_s(cost, load[0], load[1], 1.0)
    assert chain.step_s(cost, load[0], load[1], 1.0) == pytest.approx(5 * one)


def test_the_steady_point_charges_the_drafter() -> None:
    """DeepSeek's production decode (V3, MTP-1): the drafter is part of the step and of its
    breakdown; without speculation it is absent."""
    sc = load_scenario("deepseek-v3-production-h800")
    p = decode_point(sc, 64, 4989)
    parts = {k: v for k, v in p.breakdown.items() if k != "a2a_hidden"}
    assert p.breakdown["draft"] > 0
    assert sum(parts.values()) == pytest.approx(p.step_s, rel=1e-12)
    bare = decode_point(load_scenario(sc.name, ["policies.speculative.policy=none"]), 64, 4989)
    assert bare.breakdown["draft"] == 0.0


def test_the_simulated_decode_step_charges_the_drafter(tiny, monkeypatch) -> None:
    """A decode group of V4-Flash verifying five drafts: every step is longer by the drafter's
    pass (3 of 43 layers over five positions, weights read once) than the same steps with the
    drafter free — the same draws, so the same tokens."""
    sc = tiny(
        **{"model": "deepseek-v4-flash", "policies.speculative.policy": "fixed"},
    )
    charged = offline.steady_throughput(sc, 8, steps=20, warmup=2)
    monkeypatch.setattr(DraftCost, "of", classmethod(lambda cls, model, drafts: None))
    free = offline.steady_throughput(sc, 8, steps=20, warmup=2)
    assert charged.accepted_tokens_per_seq_step == free.accepted_tokens_per_seq_step
    extra = charged.mean_step_s / free.mean_step_s - 1
    assert 0.03 < extra < 3 / 43 * 1.5
