"""Expert imbalance without a cluster run: replay a stream of steps through one EP group.

A :class:`StepStream` is what an EP group reports each step (time, routed tokens per class and
layer set, per-request square sums). It comes from a cluster run (``GroupExperts.trace``) or is
made up (:func:`steady_stream`: every step the same requests of the same size). ``analyze`` runs
one group's EPLB (or static placement) over it with the scenario's expert-load model and
returns the imbalance it leaves; ``deepinfer-sim eplb`` prints that beside the static baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...models.registry import load_hardware, load_model
from ...rng import stream
from ...scenario import EplbPool, ExpertLoad, Scenario
from ...sim.core.assemble import make_step_cost
from ...sim.results.metrics import dist_stats
from ...sim.stages.expert_load import ExpertLoadModel
from ...sim.stages.expert_parallel import (
    GroupExperts,
    GroupShape,
    Pool,
    group_shape,
    pool_layer_sets,
)
from .offline import steady_throughput


@dataclass(frozen=True)
class StepStream:
    t_s: np.ndarray  # (N,) step start times
    tokens: np.ndarray  # (N, C, sets) routed tokens per class and layer set
    sq_tokens: np.ndarray  # (N, C, sets) Σ over requests of their tokens squared

    @classmethod
    def from_trace(cls, trace: list[tuple[float, np.ndarray, np.ndarray]]) -> StepStream:
        return cls(
            np.array([t for t, _, _ in trace]),
            np.stack([tok for _, tok, _ in trace]),
            np.stack([sq for _, _, sq in trace]),
        )

    def __len__(self) -> int:
        return self.t_s.size


def steady_stream(
    steps: int, step_s: float, requests: float, tokens_per_request: float, sets: int = 1
) -> StepStream:
    """Every step runs ``requests`` requests (decode sequences or prefill chunks) of
    ``tokens_per_request`` routed tokens each, through the first layer set."""
    tokens = np.zeros((steps, 1, sets))
    sq = np.zeros((steps, 1, sets))
    tokens[:, 0, 0] = requests * tokens_per_request
    sq[:, 0, 0] = requests * tokens_per_request**2
    return StepStream(np.arange(steps) * step_s, tokens, sq)


def analyze(
    sc: Scenario,
    load: ExpertLoad,
    policy: EplbPool,
    shape: GroupShape,
    streams: list[StepStream],
    classes: tuple[str, ...] = ("default",),
) -> dict[str, Any]:
    """Run one EP group per stream (one shared load model, as in a cluster) and pool them."""
    model = ExpertLoadModel(load, load_model(sc.model), classes, sc.seed)
    groups = []
    for i, s in enumerate(streams):
        g = GroupExperts(model, policy, shape, stream(sc.seed, f"experts/analysis/{i}"))
        groups.append((g, s))
    # interleave the groups' steps in time, as the event loop would
    order = sorted(
        (float(s.t_s[j]), gi, j) for gi, (_, s) in enumerate(groups) for j in range(len(s))
    )
    for t, gi, j in order:
        g, s = groups[gi]
        g.step(t, s.tokens[j], s.sq_tokens[j])
    factors = np.concatenate([np.asarray(g.factors) for g, _ in groups])
    return {
        "policy": policy.policy,
        "ep": shape.ranks,
        "redundant_experts_per_gpu": shape.redundant_per_rank,
        "window_steps": policy.window_steps,
        "period_steps": policy.period_steps,
        "steps": int(factors.size),
        "imbalance": dist_stats(factors),
        "rebalances": sum(g.rebalances for g, _ in groups),
        "moved_bytes": sum(g.moved_bytes for g, _ in groups),
        "stall_s": sum(g.stall_total_s for g, _ in groups),
    }


# A static placement's factor has no rebalances to drift between: its mean over 10^2 to 10^3
# steps agrees to 10^-3 (2026-12-07, 100 to 3,000 steps: EP4 with one sequence of 3.82 tokens
# 1.493, EP72 at 256 per GPU 2.103, EP8 at 128 per GPU 1.157).
STATIC_STEPS = 1000
_STATIC_MEANS: dict[tuple[Any, ...], float] = {}


def static_imbalance(
    sc: Scenario,
    pool: Pool,
    hardware: str,
    groups: int,
    redundant: int,
    requests: float,
    tokens: float,
    step_s: float,
) -> float:
    """The mean expert imbalance of ``groups`` expert groups whose experts stay where EP puts
    them (``redundant`` extra slots each), every step routing ``requests`` requests of ``tokens``
    tokens in all, under the scenario's expert-load model and seed: what a steady point of a
    scenario whose imbalance is ``live`` and whose pool places its experts ``static`` is costed
    with. Remembered per question (a curve asks many times)."""
    load = sc.policies.eplb.load
    policy = sc.policies.eplb.for_pool(pool)
    key = (
        sc.model,
        sc.seed,
        load,
        policy,
        pool,
        hardware,
        groups,
        redundant,
        requests,
        tokens,
        step_s,
    )
    if key not in _STATIC_MEANS:
        shape, s = _group_and_stream(
            sc, pool, hardware, groups, redundant, requests, tokens, STATIC_STEPS, step_s
        )
        static = policy.model_copy(update={"policy": "static"})
        _STATIC_MEANS[key] = analyze(sc, load, static, shape, [s])["imbalance"]["mean"]
    return _STATIC_MEANS[key]


def _group_and_stream(
    sc: Scenario,
    pool: Pool,
    hardware: str,
    groups: int,
    redundant: int,
    requests: float,
    tokens: float,
    steps: int,
    step_s: float,
) -> tuple[GroupShape, StepStream]:
    """One EP group of ``groups`` ranks of the scenario's model on ``hardware`` and ``steps``
    steady steps of ``requests`` requests of ``tokens`` routed tokens each, in all."""
    model = load_model(sc.model)
    sets = int(pool_layer_sets(model, pool).max()) + 1
    shape = group_shape(model, load_hardware(hardware), pool, groups, redundant)
    return shape, steady_stream(steps, step_s, requests, tokens, sets)


def benchmark_step_s(
    sc: Scenario, pool: Pool, ep: int, redundant: int, requests: int, tokens: float
) -> float:
    """The cost model's time for one benchmark step: ``requests`` per data-parallel rank of
    ``tokens`` each (prefill: new prompts; decode: sequences at the benchmark's context verifying
    ``tokens``)."""
    model = load_model(sc.model)
    cfg = sc.pools.prefill if pool == "prefill" else sc.pools.decode
    cost = make_step_cost(sc, pool, model, load_hardware(cfg.hardware), ep, redundant)
    ranks = cost.shape.dp
    if pool == "prefill":
        return cost.prefill_step([[(int(tokens), 0)] * requests] * ranks)
    batch = np.full(ranks, float(requests))
    context = sc.policies.eplb.benchmark.decode_context_tokens
    return cost.decode_step(batch, batch * context, tokens)


def operating_point(
    sc: Scenario,
    pool: Pool,
    ep: int,
    requests_per_rank: int | None = None,
    tokens_per_request: float | None = None,
) -> tuple[int, float]:
    """(requests per rank, routed tokens per request) of the benchmark step at EP ``ep``: what is
    given, else the scenario's ``policies.eplb.benchmark`` point, where a decode sequence computes
    its token plus the drafts DSpark verifies at that concurrency (``steady_throughput``)."""
    bench = sc.policies.eplb.benchmark
    if pool == "prefill":
        requests = requests_per_rank or bench.prefill_requests_per_rank
        return requests, tokens_per_request or float(bench.prefill_tokens_per_request)
    requests = requests_per_rank or bench.decode_requests_per_rank
    if tokens_per_request is not None:
        return requests, tokens_per_request
    decode = sc.pools.decode.model_copy(update={"ep": ep})
    at = sc.model_copy(update={"pools": sc.pools.model_copy(update={"decode": decode})})
    run = steady_throughput(at, requests, context=bench.decode_context_tokens, steps=200, warmup=20)
    return requests, 1.0 + run.verify_tokens_per_seq_step


def benchmark_point(
    sc: Scenario,
    pool: Pool,
    ep: int,
    redundant: int,
    requests_per_rank: int,
    tokens_per_request: float,
    steps: int | None = None,
    step_s: float | None = None,
    load: ExpertLoad | None = None,
) -> dict[str, Any]:
    """EPLB (the scenario's policy for the pool) and static placement side by side at a steady
    operating point of the pool at ``ep`` GPUs: every data-parallel rank (``ep / tp``) runs
    ``requests_per_rank`` requests of ``tokens_per_request`` routed tokens per step over the
    pool's ``ep / moe_tp`` expert groups, for ``steps`` steps (default three re-assignment
    periods)."""
    policy = sc.policies.eplb.for_pool(pool)
    load = load or sc.policies.eplb.load
    steps = steps or 3 * policy.period_steps
    if step_s is None:
        step_s = benchmark_step_s(sc, pool, ep, redundant, requests_per_rank, tokens_per_request)
    at = (sc.pools.prefill if pool == "prefill" else sc.pools.decode).model_copy(update={"ep": ep})
    groups = at.expert_groups
    requests = requests_per_rank * at.dp
    shape, s = _group_and_stream(
        sc, pool, at.hardware, groups, redundant, requests, tokens_per_request, steps, step_s
    )
    static = policy.model_copy(update={"policy": "static"})
    return {
        "pool": pool,
        "ep": ep,
        "expert_groups": groups,
        "redundant_experts_per_gpu": redundant,
        "requests_per_rank": requests_per_rank,
        "tokens_per_request": tokens_per_request,
        "step_s": step_s,
        "eplb": analyze(sc, load, policy, shape, [s]),
        "static": analyze(sc, load, static, shape, [s]),
    }
