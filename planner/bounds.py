"""Upper bounds on the request rate a deployment shape can sustain, from the cost models alone.

The planner ranks shapes by these bounds and skips a shape whose cheapest possible deployment
(enough replicas at its bound) already costs more than the best one simulated so far.

- Prefill: every DP rank running full steps of ``max_tokens_per_step`` new tokens as prompts of
  the workload's mean new tokens per request (prompt minus what an infinite prefix cache would
  serve; no prefix attended), at the configured constant expert imbalance: tokens/s per
  instance, divided by that mean.
- Decode: ``steady_throughput`` at the largest batch per rank that fits (``max_seqs_per_rank``
  or the KV capacity at the workload's mean context), divided by the mean output tokens.

- Aggregated (one instance prefilling and decoding on the same GPUs): the lower of the two
  bounds above for a prefill instance and a decode group shaped as the instance — it cannot
  prefill faster than if it only prefilled, nor decode faster than if it only decoded.

All take the experts as perfectly balanced (the simulation's imbalance, constant or live, is
never below 1) and ignore queueing, tiers, transfers and imbalance between instances, so the
sustainable rate the simulation finds is lower: a shape is pruned only when even its bound cannot
win (``tests/integration/test_plan_bounds.py`` holds the bounds against simulated rates).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..models.registry import load_hardware, load_model
from ..scenario import Scenario, scenario_from_dict
from ..sim.core.assemble import decode_kv_capacity_tokens, make_step_cost
from ..traces import RequestSource
from .analysis.offline import steady_throughput
from .analysis.steady import prefill_chunks


@dataclass(frozen=True)
class WorkloadStats:
    rate_rps: float  # mean arrival rate
    input_tokens: float
    new_tokens: float  # after an infinite prefix cache
    output_tokens: float
    images: float

    @classmethod
    def of(cls, source: RequestSource) -> WorkloadStats:
        n = len(source)
        span = float(source.arrival_s[-1] - source.arrival_s[0]) if n > 1 else 1.0
        hit = source.prefix_hit_tokens().astype(float)
        return cls(
            rate_rps=(n - 1) / span if n > 1 else 1.0,
            input_tokens=float(source.input_len.mean()),
            new_tokens=float(np.mean(source.input_len - hit)),
            output_tokens=float(source.output_len.mean()),
            images=float(source.image_count.mean()),
        )


def prefill_tokens_per_s(sc: Scenario, prompt_tokens: float) -> float:
    """New tokens per second one prefill instance of the scenario computes at full steps of
    prompts of ``prompt_tokens`` new tokens (chunks of ``max_tokens_per_step`` when longer).

    An upper bound for a workload whose mean new tokens per request is ``prompt_tokens``: a
    prompt's attention grows faster than its length, so prompts of the mean length cost at most
    what the workload's mix does (and its chunks after the first attend to a prefix this
    leaves out)."""
    pool = sc.pools.prefill
    model = load_model(sc.model)
    cost = make_step_cost(
        sc, "prefill", model, load_hardware(pool.hardware), pool.ep, pool.redundant_per_gpu
    )
    n = pool.max_tokens_per_step
    chunks = prefill_chunks(n, max(1, min(n, int(prompt_tokens))))
    step = cost.prefill_step([chunks] * pool.dp, PERFECT_BALANCE)
    return pool.dp * n / step


PERFECT_BALANCE = 1.0  # slowest rank's expert load over the mean

_DECODE_CACHE: dict[tuple[str, int], float] = {}


def _decode_tok_s_per_rank(sc: Scenario, context: int) -> float:
    key = (sc.model_dump_json(exclude={"pools": {"prefill"}, "workload": True}), context)
    if key not in _DECODE_CACHE:
        _DECODE_CACHE[key] = _measure_decode(sc, context)
    return _DECODE_CACHE[key]


def _balanced(sc: Scenario) -> Scenario:
    """``sc`` with every expert equally loaded on every step (no rank can carry less than the
    mean: the fastest an EP group steps)."""
    data = sc.model_dump(mode="json")
    data["policies"]["eplb"]["imbalance"] = "constant"
    data["policies"]["expert_imbalance"] = {"prefill": PERFECT_BALANCE, "decode": PERFECT_BALANCE}
    return scenario_from_dict(data)


def _measure_decode(sc: Scenario, context: int) -> float:
    sc = _balanced(sc)
    pool = sc.pools.decode
    model = load_model(sc.model)
    kv = decode_kv_capacity_tokens(sc, model, load_hardware(pool.hardware))
    per_rank = int(max(1, min(pool.max_seqs_per_rank, kv // max(context, 1))))
    run = steady_throughput(sc, per_rank, context=context, steps=60, warmup=10)
    # the run's sequences reserve KV for more output than the workload's (none may end while it
    # is measured), so it may hold fewer than per_rank; its step is then no longer than one of
    # per_rank sequences, and per_rank times its per-sequence rate stays a bound
    return per_rank * run.accepted_tokens_per_seq_step / run.mean_step_s


def decode_tokens_per_s(sc: Scenario, context: int) -> float:
    """Output tokens per second one decode group sustains at its largest batch."""
    return _decode_tok_s_per_rank(sc, context) * sc.pools.decode.dp


def rate_bound(sc: Scenario, stats: WorkloadStats) -> float:
    """Requests per second one unit (the scenario's prefill instances + decode groups) cannot
    exceed."""
    pool = sc.pools
    context = int(stats.input_tokens + stats.output_tokens / 2)
    new_tokens = max(stats.new_tokens, 1.0)
    prefill = pool.prefill.instances * prefill_tokens_per_s(sc, new_tokens) / new_tokens
    decode = pool.decode.groups * decode_tokens_per_s(sc, context) / max(stats.output_tokens, 1.0)
    return min(prefill, decode)


def unit_rate_bound(sc: Scenario, stats: WorkloadStats) -> float:
    """:func:`rate_bound` of the scenario's unit, aggregated or disaggregated."""
    return rate_bound(as_disaggregated(sc) if sc.aggregated else sc, stats)


def as_disaggregated(sc: Scenario) -> Scenario:
    """A disaggregated scenario with one prefill instance and one decode group each shaped as
    ``sc``'s aggregated instances (the same GPUs, parallelism, token budget and batch cap)."""
    data = sc.model_dump(mode="json")
    agg = data["pools"].pop("aggregated")
    data["serving"] = "disaggregated"
    common = {k: agg[k] for k in ("ep", "hardware", "tp", "moe_tp", "two_batch_overlap")}
    data["pools"]["prefill"].update(
        common, instances=agg["instances"], max_tokens_per_step=agg["max_tokens_per_step"]
    )
    data["pools"]["decode"].update(
        common, groups=agg["instances"], max_seqs_per_rank=agg["max_seqs_per_rank"]
    )
    return scenario_from_dict(data)
